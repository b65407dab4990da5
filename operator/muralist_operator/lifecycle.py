"""Decide what a DiffusionJob needs next, from what was observed. Pure: no API calls.

`decide` takes the job, its current status and the observed children, and returns the new
status, the actions to take on children, and the events to emit once the status is written.
Handlers (handlers.py) observe, call this, act, write status once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from muralist_runtime.spec import (
    TERMINAL_PHASES,
    Condition,
    DiffusionJob,
    DiffusionJobStatus,
    Phase,
    RunPolicy,
)

from muralist_operator.observe import Observed, PodView, RankReport

REASON_INVALID_SPEC = "InvalidSpec"
REASON_DEADLINE = "DeadlineExceeded"
REASON_PERMANENT = "PermanentError"
REASON_MAX_RESTARTS = "MaxRestartsExceeded"
REASON_POD_FAILED = "PodFailed"
REASON_STALLED = "Stalled"

CONDITION_TYPES = ("Created", "Running", "Restarting", "Suspended", "Complete", "Failed", "Ready", "Stalled")


@dataclass(frozen=True)
class CreateJob:
    attempt: int
    active_deadline_seconds: int | None


@dataclass(frozen=True)
class DeleteJob:
    reason: str


@dataclass(frozen=True)
class SetJobSuspend:
    suspend: bool


@dataclass(frozen=True)
class DeleteSelf:
    reason: str


Action = CreateJob | DeleteJob | SetJobSuspend | DeleteSelf


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Decision:
    status: DiffusionJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


class _Transition:
    """Builds the new status; records a phase change as an event."""

    def __init__(self, old: DiffusionJobStatus, generation: int | None, now: datetime):
        self.old_phase = old.phase
        self.status = old.model_copy(deep=True)
        self.status.observed_generation = generation
        self.now = now
        self.decision = Decision(self.status)

    def act(self, action: Action) -> None:
        self.decision.actions.append(action)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.decision.events.append(Event(type_, reason, message))

    def phase(self, phase: Phase, reason: str, message: str = "") -> None:
        st = self.status
        st.phase = phase
        st.message = message or reason
        if phase in TERMINAL_PHASES and not st.completion_time:
            st.completion_time = iso(self.now)
        truth = {
            "Running": phase == Phase.RUNNING,
            "Restarting": phase == Phase.RESTARTING,
            "Suspended": phase == Phase.SUSPENDED,
            "Complete": phase == Phase.SUCCEEDED,
            "Failed": phase == Phase.FAILED,
            # kstatus (Flux, Argo's kstatus users) reads Ready, and Stalled as "will not progress".
            "Ready": phase in (Phase.RUNNING, Phase.SUCCEEDED),
            "Stalled": phase == Phase.FAILED,
        }
        for type_, value in truth.items():
            if value or type_ == "Ready" or _find(st.conditions, type_) is not None:
                self.condition(type_, value, reason, st.message)
        if phase != self.old_phase:
            warning = phase in (Phase.FAILED, Phase.RESTARTING)
            self.event("Warning" if warning else "Normal", reason, st.message)

    def condition(self, type_: str, value: bool, reason: str, message: str) -> None:
        set_condition(self.status.conditions, type_, value, reason, message, self.now, self.status.observed_generation)


def _find(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: list[Condition],
    type_: str,
    value: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> None:
    status = "True" if value else "False"
    existing = _find(conditions, type_)
    if existing is None:
        conditions.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=iso(now),
                observed_generation=generation,
            )
        )
        conditions.sort(key=lambda c: CONDITION_TYPES.index(c.type) if c.type in CONDITION_TYPES else 99)
        return
    if existing.status != status:
        existing.last_transition_time = iso(now)
    existing.status, existing.reason, existing.message = status, reason, message
    existing.observed_generation = generation


def aggregate_progress(status: DiffusionJobStatus, ranks: dict[str, RankReport], known_total: int | None) -> None:
    writers = [r for r in ranks.values() if r.total > 0 or r.completed or r.skipped]
    completed = sum(r.completed + r.skipped for r in writers)
    failed = sum(r.failed for r in writers)
    total = known_total if known_total is not None else sum(r.total for r in writers)
    progress = status.progress
    progress.total = max(total, progress.total)
    progress.completed = min(max(completed, progress.completed), progress.total or completed)
    progress.failed = failed
    progress.summary = f"{progress.completed}/{progress.total}"


def _first_failure(pods: list[PodView]) -> PodView | None:
    failed = [p for p in pods if p.phase == "Failed" or p.termination is not None]
    # A permanent error anywhere decides the outcome: report that pod first.
    failed.sort(key=lambda p: (not (p.termination and p.termination.permanent), p.index))
    return failed[0] if failed else None


def _stalled(job: DiffusionJob, observed: Observed, attempt: int, now: datetime) -> int | None:
    """Seconds without progress, when over runPolicy.stallTimeoutSeconds; else None.

    The clock of a rank starts at its first step: loading and rendezvous have their own
    guards (collectiveTimeoutSeconds, activeDeadlineSeconds) and vary too much with the model
    and the node to share one timeout with a denoising step.
    """
    timeout = job.spec.run_policy.stall_timeout_seconds
    if timeout is None:
        return None
    latest: list[datetime] = []
    for report in observed.ranks.values():
        if report.attempt != attempt or not report.progress_time:
            continue
        if report.total and report.completed + report.skipped + report.failed >= report.total:
            continue  # this rank is done: silence is expected
        moment = parse_time(report.progress_time)
        if moment is not None:
            latest.append(moment)
    if not latest:
        return None
    quiet = int((now - min(latest)).total_seconds())
    return quiet if quiet > timeout else None


def _restart_or_fail(t: _Transition, job: DiffusionJob, reason: str, message: str) -> None:
    st = t.status
    if st.restarts < job.spec.run_policy.max_restarts:
        st.restarts += 1
        t.phase(
            Phase.RESTARTING,
            reason,
            f"{message}; restarting the pod group ({st.restarts}/{job.spec.run_policy.max_restarts})",
        )
        t.act(DeleteJob(reason))
    else:
        t.phase(
            Phase.FAILED,
            REASON_MAX_RESTARTS,
            f"{message}; gave up after {st.restarts} restarts (runPolicy.maxRestarts)",
        )
        t.act(DeleteJob(REASON_MAX_RESTARTS))


def decide_invalid(status: DiffusionJobStatus, generation: int | None, problems: list[str], now: datetime) -> Decision:
    t = _Transition(status, generation, now)
    t.phase(Phase.FAILED, REASON_INVALID_SPEC, "; ".join(problems)[:2000])
    return t.decision


def _suspension(policy: RunPolicy) -> tuple[str, str]:
    """Reason and message of a suspended job: the same whether its Job was just created or seen."""
    if policy.suspend:
        return "Suspended", "suspended by runPolicy.suspend"
    return "Queued", f"waiting for Kueue to admit it from queue {policy.queue_name}"


def decide(
    job: DiffusionJob, status: DiffusionJobStatus, generation: int | None, observed: Observed, now: datetime
) -> Decision:
    t = _Transition(status, generation, now)
    st = t.status
    par, policy = job.spec.parallelism, job.spec.run_policy
    st.world_size, st.data_parallel_degree = par.world_size, par.data_parallel_degree
    st.output_path = job.output_path
    aggregate_progress(st, observed.ranks, job.total_images)

    # 1. Finished jobs only wait for their time-to-live.
    if st.phase in TERMINAL_PHASES:
        finished = parse_time(st.completion_time)
        ttl = policy.ttl_seconds_after_finished
        if ttl is not None and finished and (now - finished).total_seconds() >= ttl:
            t.act(DeleteSelf(f"ttlSecondsAfterFinished={ttl} passed"))
        return t.decision

    attempt = st.restarts
    current = observed.job
    pods = [p for p in observed.pods if p.attempt == attempt and not p.deleting]

    # 2. The deadline counts from the first start, across restarts.
    started = parse_time(st.start_time)
    deadline = policy.active_deadline_seconds
    if deadline is not None and started and (now - started).total_seconds() >= deadline:
        t.phase(Phase.FAILED, REASON_DEADLINE, f"did not finish within activeDeadlineSeconds={deadline}")
        if current is not None and not current.deleting:
            t.act(DeleteJob(REASON_DEADLINE))
        return t.decision

    # 3. No pod group: create one (the first, or the next after a restart).
    if current is None:
        remaining = None
        if deadline is not None:
            remaining = max(1, deadline - int((now - started).total_seconds())) if started else deadline
        t.act(CreateJob(attempt, remaining))
        t.condition("Created", True, "JobCreated", f"pod group {attempt} created")
        t.event("Normal", "JobCreated", f"created pod group {attempt}: {par.nodes} pod(s), world size {par.world_size}")
        if st.phase == Phase.RESTARTING:
            return t.decision
        if policy.suspend or policy.queue_name:
            t.phase(Phase.SUSPENDED, *_suspension(policy))
        else:
            t.phase(Phase.PENDING, "JobCreated", f"waiting for {par.nodes} pod(s)")
        return t.decision

    # 4. A group left over from before a restart goes first.
    if current.attempt < attempt or current.deleting:
        if not current.deleting:
            t.act(DeleteJob("stale pod group"))
        if st.phase != Phase.RESTARTING:
            t.phase(Phase.RESTARTING, "Restarting", "waiting for the previous pod group to go")
        return t.decision

    # 5. Suspension (by the user, or by Kueue until it admits the Job).
    if not current.complete and not current.failed:
        if policy.suspend and not current.suspended:
            t.act(SetJobSuspend(True))
        elif not policy.suspend and current.suspended and not policy.queue_name:
            t.act(SetJobSuspend(False))
        if policy.suspend or (current.suspended and policy.queue_name):
            t.phase(Phase.SUSPENDED, *_suspension(policy))
            return t.decision

    # 6. Outcomes.
    if current.complete:
        st.progress.completed = st.progress.total = max(st.progress.total, st.progress.completed)
        st.progress.summary = f"{st.progress.completed}/{st.progress.total}"
        t.phase(Phase.SUCCEEDED, "Completed", f"{st.progress.completed} images in {job.output_path}")
        return t.decision
    failure = _first_failure(pods)
    if current.failed or failure is not None:
        if current.failure_reason == REASON_DEADLINE:
            t.phase(Phase.FAILED, REASON_DEADLINE, f"did not finish within activeDeadlineSeconds={deadline}")
            return t.decision
        term = failure.termination if failure else None
        where = f"pod {failure.index}" if failure else "pod group"
        detail = term.summary if term else (current.failure_message or current.failure_reason or "failed")
        if term is not None and term.permanent:
            t.phase(Phase.FAILED, REASON_PERMANENT, f"{where}: {detail} (permanent, not restarted)")
            t.act(DeleteJob(REASON_PERMANENT))
        else:
            _restart_or_fail(t, job, REASON_POD_FAILED, f"{where} failed: {detail}")
        return t.decision

    # 7. Running, or still coming up; a group that stopped progressing is restarted.
    if current.start_time and not st.start_time:
        st.start_time = current.start_time
    quiet = _stalled(job, observed, attempt, now)
    if quiet is not None:
        _restart_or_fail(t, job, REASON_STALLED, f"no progress for {quiet}s (runPolicy.stallTimeoutSeconds)")
        return t.decision
    running = [p for p in pods if p.phase == "Running"]
    if len(running) >= par.nodes or current.ready >= par.nodes:
        t.phase(Phase.RUNNING, "Running", f"{par.nodes} pod(s), world size {par.world_size}")
    else:
        t.phase(Phase.PENDING, "Starting", f"{len(running)}/{par.nodes} pod(s) running")
    return t.decision
