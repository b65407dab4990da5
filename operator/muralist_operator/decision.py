"""What a reconcile decides: the new status, actions on children, events. Plain data.

`Transition` builds the new status from the old one and records a phase change as an event,
so every policy (policies/) and `lifecycle.decide` speak the same small vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from muralist_api.status import TERMINAL_PHASES, Condition, DiffusionJobStatus, Phase

REASON_INVALID_SPEC = "InvalidSpec"
REASON_RENDER_FAILED = "RenderFailed"
REASON_DEADLINE = "DeadlineExceeded"
REASON_PERMANENT = "PermanentError"
REASON_MAX_RESTARTS = "MaxRestartsExceeded"
REASON_POD_FAILED = "PodFailed"
REASON_STALLED = "Stalled"
REASON_WORLD_FAILED = "WorldPeerFailed"
REASON_ALL_ITEMS_FAILED = "AllItemsFailed"
REASON_NAME_TAKEN = "NameTaken"
REASON_CHILD_RESTORED = "ChildRestored"
REASON_EARLIER_JOB = "EarlierJobDeleting"

CONDITION_TYPES = ("Created", "Running", "Restarting", "Suspended", "Complete", "Failed", "Ready", "Stalled",
                   "PodsNotStarting", "ProgressUnreachable")


@dataclass(frozen=True)
class CreateJob:
    active_deadline_seconds: int | None


@dataclass(frozen=True)
class DeleteJob:
    reason: str


@dataclass(frozen=True)
class SetJobSuspend:
    suspend: bool


@dataclass(frozen=True)
class ResizeJob:
    """Change the Job's completions and parallelism together (an elastic Indexed Job): new
    indexes start claiming work; the Job controller deletes the highest ones, which drain."""

    nodes: int


@dataclass(frozen=True)
class RestoreChildren:
    """Create again what the job owns besides its Job and is gone (its NetworkPolicy, Service or
    spec ConfigMap, deleted by someone): (kind, name) of each."""

    children: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DeleteSelf:
    reason: str


@dataclass(frozen=True)
class StopPod:
    """Delete one pod (the Job controller retries its index like any failure), after noting on
    it why (observe.STOPPED_ANNOTATION)."""

    name: str
    uid: str
    reason: str
    note: str


Action = CreateJob | DeleteJob | SetJobSuspend | ResizeJob | DeleteSelf | StopPod | RestoreChildren


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
    # When the job must be decided again though nothing changes (a timeout that will have
    # passed by then): the reconciler's clock wakes it at that time (Transition.check_again).
    check_again_at: datetime | None = None


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(conditions: list[Condition], type_: str, value: bool, reason: str, message: str,
                  now: datetime, generation: int | None) -> None:
    status: Literal["True", "False"] = "True" if value else "False"
    existing = find_condition(conditions, type_)
    if existing is None:
        conditions.append(Condition(type=type_, status=status, reason=reason, message=message,
                                    last_transition_time=iso(now), observed_generation=generation))
        conditions.sort(key=lambda c: CONDITION_TYPES.index(c.type) if c.type in CONDITION_TYPES else 99)
        return
    if existing.status != status:
        existing.last_transition_time = iso(now)
    existing.status, existing.reason, existing.message = status, reason, message
    existing.observed_generation = generation


class Transition:
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

    def check_again(self, at: datetime) -> None:
        """Decide this job again at `at` (the earliest of all asked for wins); a policy whose
        verdict moves with time alone asks for the moment it could change."""
        current = self.decision.check_again_at
        if current is None or at < current:
            self.decision.check_again_at = at

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
            if value or type_ == "Ready" or find_condition(st.conditions, type_) is not None:
                self.condition(type_, value, reason, st.message)
        if phase != self.old_phase:
            warning = phase in (Phase.FAILED, Phase.RESTARTING)
            self.event("Warning" if warning else "Normal", reason, st.message)

    def condition(self, type_: str, value: bool, reason: str, message: str) -> None:
        set_condition(self.status.conditions, type_, value, reason, message, self.now, self.status.observed_generation)

    def drop_condition(self, type_: str) -> None:
        """For a condition that is there only while something is wrong (PodsNotStarting)."""
        self.status.conditions = [c for c in self.status.conditions if c.type != type_]


def decide_waiting(status: DiffusionJobStatus, generation: int | None, reason: str, message: str,
                   now: datetime) -> Decision:
    """A job that cannot create its children yet (an earlier job's of the same name are going): Pending."""
    t = Transition(status, generation, now)
    t.phase(Phase.PENDING, reason, message)
    return t.decision


def decide_failed(status: DiffusionJobStatus, generation: int | None, reason: str, message: str,
                  now: datetime) -> Decision:
    """A job that cannot run as written (invalid spec, unrenderable): Failed, with the reason."""
    t = Transition(status, generation, now)
    t.phase(Phase.FAILED, reason, message[:2000])
    return t.decision
