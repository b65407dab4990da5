"""Failures: which pod failed, whether retrying can help, and restarting or giving up."""

from __future__ import annotations

from muralist_runtime.spec.api import DiffusionJob
from muralist_runtime.spec.status import Phase

from muralist_operator.decision import (
    REASON_MAX_RESTARTS,
    REASON_PERMANENT,
    REASON_POD_FAILED,
    DeleteJob,
    Transition,
)
from muralist_operator.observe import JobView, PodView


def first_failure(pods: list[PodView]) -> PodView | None:
    """The failed pod to report: a permanent failure anywhere decides the outcome."""
    failed = [p for p in pods if p.phase == "Failed" or p.termination is not None]
    failed.sort(key=lambda p: (not (p.termination and p.termination.permanent), p.index))
    return failed[0] if failed else None


def restart_or_fail(t: Transition, job: DiffusionJob, reason: str, message: str) -> None:
    """Recreate the pod group while restarts are left (runPolicy.maxRestarts); else fail."""
    st, limit = t.status, job.spec.run_policy.max_restarts
    if st.restarts < limit:
        st.restarts += 1
        t.phase(Phase.RESTARTING, reason, f"{message}; restarting the pod group ({st.restarts}/{limit})")
        t.act(DeleteJob(reason))
    else:
        t.phase(Phase.FAILED, REASON_MAX_RESTARTS, f"{message}; gave up after {st.restarts} restarts "
                "(runPolicy.maxRestarts)")
        t.act(DeleteJob(REASON_MAX_RESTARTS))


def handle_failure(t: Transition, job: DiffusionJob, current: JobView, pods: list[PodView]) -> bool:
    """Decide for a failed group; False when nothing failed."""
    failure = first_failure(pods)
    if not current.failed and failure is None:
        return False
    term = failure.termination if failure else None
    where = f"pod {failure.index}" if failure else "pod group"
    detail = term.summary if term else (current.failure_message or current.failure_reason or "failed")
    if term is not None and term.permanent:
        t.phase(Phase.FAILED, REASON_PERMANENT, f"{where}: {detail} (permanent, not restarted)")
        t.act(DeleteJob(REASON_PERMANENT))
    else:
        restart_or_fail(t, job, REASON_POD_FAILED, f"{where} failed: {detail}")
    return True
