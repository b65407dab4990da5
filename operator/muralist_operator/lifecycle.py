"""Decide what a DiffusionJob needs next, from what was observed. Pure: no API calls.

`decide` takes the job, its current status and the observed children, and returns the new
status, the actions to take on children, and the events to emit once the status is written.
It applies the policies (policies/) in order; handlers.py observes, calls this, writes the
status once, acts.
"""

from __future__ import annotations

from datetime import datetime

from muralist_runtime.spec.api import DiffusionJob
from muralist_runtime.spec.status import TERMINAL_PHASES, DiffusionJobStatus, Phase

from muralist_operator.decision import (
    REASON_DEADLINE,
    REASON_STALLED,
    CreateJob,
    Decision,
    DeleteJob,
    DeleteSelf,
    Transition,
)
from muralist_operator.observe import Observed, RankReport
from muralist_operator.policies import deadline, failure, stall, suspension, ttl


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


def _create_pod_group(t: Transition, job: DiffusionJob, now: datetime) -> Decision:
    """No pod group: create one (the first, or the next after a restart)."""
    st, par, policy = t.status, job.spec.parallelism, job.spec.run_policy
    t.act(CreateJob(st.restarts, deadline.remaining(st, policy, now)))
    t.condition("Created", True, "JobCreated", f"pod group {st.restarts} created")
    t.event("Normal", "JobCreated",
            f"created pod group {st.restarts}: {par.nodes} pod(s), world size {par.world_size}")
    if st.phase == Phase.RESTARTING:
        return t.decision
    if suspension.created_suspended(policy):
        t.phase(Phase.SUSPENDED, *suspension.reason(policy))
    else:
        t.phase(Phase.PENDING, "JobCreated", f"waiting for {par.nodes} pod(s)")
    return t.decision


def decide(
    job: DiffusionJob, status: DiffusionJobStatus, generation: int | None, observed: Observed, now: datetime
) -> Decision:
    t = Transition(status, generation, now)
    st = t.status
    par, policy = job.spec.parallelism, job.spec.run_policy
    st.world_size, st.data_parallel_degree = par.world_size, par.data_parallel_degree
    st.output_path = job.output_path
    aggregate_progress(st, observed.ranks, job.total_images)

    # 1. Finished jobs only wait for their time-to-live.
    if st.phase in TERMINAL_PHASES:
        gone = ttl.expired(st, policy, now)
        if gone:
            t.act(DeleteSelf(gone))
        return t.decision

    attempt, current = st.restarts, observed.job
    pods = [p for p in observed.pods if p.attempt == attempt and not p.deleting]

    # 2. The deadline counts from the first start, across restarts.
    if deadline.exceeded(st, policy, now):
        t.phase(Phase.FAILED, REASON_DEADLINE, deadline.message(policy))
        if current is not None and not current.deleting:
            t.act(DeleteJob(REASON_DEADLINE))
        return t.decision

    # 3. No pod group: create one.
    if current is None:
        return _create_pod_group(t, job, now)

    # 4. A group left over from before a restart goes first.
    if current.attempt < attempt or current.deleting:
        if not current.deleting:
            t.act(DeleteJob("stale pod group"))
        if st.phase != Phase.RESTARTING:
            t.phase(Phase.RESTARTING, "Restarting", "waiting for the previous pod group to go")
        return t.decision

    # 5. Suspension (by the user, or by Kueue until it admits the Job).
    flip = suspension.action(policy, current)
    if flip is not None:
        t.act(flip)
    if suspension.is_suspended(policy, current):
        t.phase(Phase.SUSPENDED, *suspension.reason(policy))
        return t.decision

    # 6. Outcomes.
    if current.complete:
        st.progress.completed = st.progress.total = max(st.progress.total, st.progress.completed)
        st.progress.summary = f"{st.progress.completed}/{st.progress.total}"
        t.phase(Phase.SUCCEEDED, "Completed", f"{st.progress.completed} images in {job.output_path}")
        return t.decision
    if current.failed and current.failure_reason == REASON_DEADLINE:
        t.phase(Phase.FAILED, REASON_DEADLINE, deadline.message(policy))
        return t.decision
    if failure.handle_failure(t, job, current, pods):
        return t.decision

    # 7. Running, or still coming up; a group that stopped progressing is restarted.
    if current.start_time and not st.start_time:
        st.start_time = current.start_time
    quiet = stall.stalled_seconds(policy, observed.ranks, attempt, now)
    if quiet is not None:
        failure.restart_or_fail(t, job, REASON_STALLED, stall.message(quiet))
        return t.decision
    running = [p for p in pods if p.phase == "Running"]
    if len(running) >= par.nodes or current.ready >= par.nodes:
        t.phase(Phase.RUNNING, "Running", f"{par.nodes} pod(s), world size {par.world_size}")
    else:
        t.phase(Phase.PENDING, "Starting", f"{len(running)}/{par.nodes} pod(s) running")
    return t.decision
