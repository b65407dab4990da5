"""Failures, per index: each pod is its own failure domain and the Job controller retries it alone.

The Job carries the rules (render.render_job: backoffLimitPerIndex = runPolicy.maxRestarts,
maxFailedIndexes 0, podFailurePolicy FailJob on exit 78 and Ignore on disruptions); this policy
reads what happened from the pods and the Job and says it in status: which index failed, how
often, why, and when the job as a whole has failed.

- A permanent failure (exit 78, or `"permanent": true` in a termination message, which
  torchrun's own exit code may hide from the Job's rules) fails the job at once.
- An index that failed more than maxRestarts times fails the job (the Job controller fails the
  Job too, since maxFailedIndexes is 0).
- Otherwise the job stays Running while the failed index is retried; `status.indexes` and
  `status.restarts` count the retries.
"""

from __future__ import annotations

from muralist_api import contract
from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE
from muralist_api.job import DiffusionJob
from muralist_api.status import MAX_FAILURE_MESSAGE, MAX_INDEX_ENTRIES, IndexStatus, Phase

from muralist_operator.decision import (
    REASON_DEADLINE,
    REASON_MAX_RESTARTS,
    REASON_PERMANENT,
    REASON_POD_FAILED,
    DeleteJob,
    Transition,
    iso,
)
from muralist_operator.observe import ByIndex, IndexFailures, JobView, PodView, by_index

# The Job controller's reasons on its Failed condition.
JOB_PERMANENT = "PodFailurePolicy"
JOB_OUT_OF_RETRIES = ("MaxFailedIndexesExceeded", "FailedIndexes", "BackoffLimitExceeded")


def failure_reason(pod: PodView) -> str:
    if pod.stop_reason:
        return pod.stop_reason
    if pod.termination is not None and pod.termination.permanent:
        return REASON_PERMANENT
    return REASON_POD_FAILED


def describe(pod: PodView) -> str:
    """What went wrong with this pod, in one line."""
    if pod.stopped:
        return pod.stop_note or pod.stopped
    term = pod.termination
    if term is None:
        return "failed"
    report = contract.Termination.parse(term.message)
    if report is not None and report.message:
        return report.message  # the runtime's own words name the cause (and the field to change)
    summary = term.summary
    return summary if summary.startswith("exit code") else f"exit code {term.exit_code}: {summary}"


def permanent(pods: list[PodView]) -> PodView | None:
    """A pod whose failure no retry can fix (the lowest index, if several)."""
    found = [p for p in pods if p.termination is not None and p.termination.permanent]
    return min(found, key=lambda p: p.index) if found else None


def record(t: Transition, indexes: ByIndex, limit: int) -> list[IndexFailures]:
    """Bring status.indexes and status.restarts up to date; returns the indexes with a failure
    not seen before (for events). Counts never go down: the Job's old pods may be gone."""
    st = t.status
    known = {entry.index: entry for entry in st.indexes}
    new: list[IndexFailures] = []
    for index, seen in sorted(indexes.items()):
        entry = known.get(index)
        if seen.failures == 0 or seen.last_failed is None:
            continue
        if entry is not None and entry.failures >= seen.failures:
            continue
        pod = seen.last_failed
        known[index] = IndexStatus(index=index, failures=seen.failures, last_failure_reason=failure_reason(pod),
                                   last_failure=f"pod {pod.name}: {describe(pod)}"[:MAX_FAILURE_MESSAGE],
                                   last_failure_time=pod.finished or iso(t.now))
        new.append(seen)
    entries = sorted(known.values(), key=lambda e: (e.last_failure_time or "", e.index), reverse=True)
    st.indexes = sorted(entries[:MAX_INDEX_ENTRIES], key=lambda e: e.index)
    # A failure beyond the limit, or a permanent one, is not retried: it fails the job instead.
    retries = sum(min(e.failures, limit) - (e.last_failure_reason == REASON_PERMANENT) for e in known.values())
    st.restarts = max(st.restarts, retries)
    return new


def handle(t: Transition, job: DiffusionJob, current: JobView, pods: list[PodView],
           indexes: ByIndex | None = None) -> bool:
    """Record the failures and decide for the job; True when it has failed (the decision is made).
    `indexes`: by_index(pods), when the caller has it already."""
    limit = job.spec.run_policy.max_restarts
    indexes = by_index(pods) if indexes is None else indexes
    for seen in record(t, indexes, limit):
        pod = seen.last_failed
        assert pod is not None
        verdict = (f"retrying it alone ({min(seen.failures, limit)}/{limit})" if seen.failures <= limit
                   else "no retries left")
        t.event("Warning", failure_reason(pod), f"index {seen.index} (pod {pod.name}) {describe(pod)}; {verdict}")

    # 1. What no retry can fix.
    doomed = permanent(pods)
    if doomed is not None or (current.failed and current.failure_reason == JOB_PERMANENT):
        detail = f"index {doomed.index} (pod {doomed.name}): {describe(doomed)}" if doomed else current.failure_message
        t.phase(Phase.FAILED, REASON_PERMANENT, f"{detail} (permanent, not retried)"[:2000])
        hidden = doomed is not None and doomed.termination is not None \
            and doomed.termination.exit_code != PERMANENT_FAILURE_EXIT_CODE
        if hidden and not current.failed:
            t.act(DeleteJob(REASON_PERMANENT))  # the Job's FailJob rule cannot see it: stop the pods
        return True
    # 2. An index out of retries.
    spent = sorted((s for s in indexes.values() if s.failures > limit), key=lambda s: s.index)
    if spent or (current.failed and current.failure_reason in JOB_OUT_OF_RETRIES):
        if spent and spent[0].last_failed is not None:
            s = spent[0]
            detail = f"index {s.index} failed {s.failures} times, last: {describe(s.last_failed)}"  # type: ignore[arg-type]
        else:
            detail = current.failure_message or f"indexes {current.failed_indexes} failed"
        t.phase(Phase.FAILED, REASON_MAX_RESTARTS, f"{detail}; gave up after {limit} retries of that index "
                "(runPolicy.maxRestarts)")
        return True
    # 3. The Job failed for another reason (its deadline is handled before this policy).
    if current.failed and current.failure_reason != REASON_DEADLINE:
        t.phase(Phase.FAILED, REASON_POD_FAILED, current.failure_message or current.failure_reason or "the Job failed")
        return True
    return False


def retrying(indexes: ByIndex, limit: int) -> list[IndexFailures]:
    """Indexes (by_index) waiting for, or starting, their next pod (for the Running message)."""
    return sorted((s for s in indexes.values() if s.retrying and s.failures <= limit), key=lambda s: s.index)
