"""Decide what a DiffusionJob needs next, from what was observed. Pure: no API calls.

`decide` takes the job, its current status, the observed children and the progress the pods
pushed, and returns the new status, the actions to take on children, and the events to emit
once the status is written. It applies the policies (policies/) in order; the Reconciler
(reconciler.py) observes, calls this, writes the status once, acts.
"""

from __future__ import annotations

from datetime import datetime

from muralist_api.job import DiffusionJob
from muralist_api.status import TERMINAL_PHASES, DiffusionJobStatus, Phase
from muralist_api.step_cache import CacheSample, CacheVerifyStatus
from muralist_api.storage import join_uri

from muralist_operator.decision import (
    REASON_ALL_ITEMS_FAILED,
    REASON_CHILD_RESTORED,
    REASON_DEADLINE,
    REASON_STALLED,
    REASON_WORLD_FAILED,
    CreateJob,
    Decision,
    DeleteJob,
    DeleteSelf,
    RestoreChildren,
    StopPod,
    Transition,
)
from muralist_operator.naming import pod_selector
from muralist_operator.observe import ByIndex, Observed, PodView, by_index
from muralist_operator.policies import cost, deadline, failure, resize, stall, start, suspension, ttl, world
from muralist_operator.progress.snapshot import JobProgress


def eta_text(seconds: int | None) -> str:
    """4m10s, 2h05m, 3d04h: what a person reads in `kubectl get dj`."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def apply_progress(status: DiffusionJobStatus, pushed: JobProgress | None, known_total: int | None) -> None:
    """status.progress from the pods' pushed counts (and their termination messages, which the
    aggregator holds too). Counts never go down: after an operator restart the status keeps
    what was written until the pods have posted again. Once the first pod merged, its counts (the
    merged manifest's) are the job's: they replace what the pods counted (a retried pod's items
    counted twice, a kept chunk counted by two attempts)."""
    p = status.progress
    if known_total is not None:
        p.total = known_total
    elif pushed is not None:
        p.total = max(p.total, pushed.total)
    if pushed is not None and pushed.merged:
        p.total, p.completed, p.failed = pushed.total or p.total, pushed.completed, pushed.failed
        p.kept, p.rerendered = pushed.kept, pushed.rerendered
        p.steps_saved, p.steps_lost = pushed.steps_saved, pushed.steps_lost
    elif pushed is not None:
        p.completed = max(p.completed, pushed.completed)
        p.kept, p.rerendered = max(p.kept, pushed.kept), max(p.rerendered, pushed.rerendered)
        p.failed = pushed.failed
        p.images_per_second = pushed.images_per_second
        p.estimated_seconds_remaining = pushed.estimated_seconds_remaining
    if p.total:
        p.completed = min(p.completed, p.total)
        p.percent = min(100.0, round(100.0 * (p.completed + p.failed) / p.total, 1))
    _summarise(status)


def apply_cache_verify(status: DiffusionJobStatus, pods: list[PodView]) -> None:
    """status.cacheVerify: generation.cache.verify's sample as the finished pods' termination
    messages report it (each pod its own share; pods that are gone keep what was written)."""
    total: CacheSample | None = None
    for pod in pods:
        if pod.cache_sample is not None:
            total = pod.cache_sample.combine(total)
    if total is None:
        return
    known = status.cache_verify
    if known is not None and known.sampled > total.sampled:
        return  # pods were deleted since (a retry, a TTL): keep the fuller figure
    status.cache_verify = CacheVerifyStatus(sampled=total.sampled, min_psnr=total.min_psnr, min_ssim=total.min_ssim,
                                            cache_off=total.cache_off)


def finish_progress(status: DiffusionJobStatus) -> None:
    """A finished job has no rate or time left; a successful one has every image accounted for
    (pods whose counts never reached us finished too)."""
    p = status.progress
    if status.phase == Phase.SUCCEEDED:
        p.completed = max(p.completed, p.total - p.failed)
        p.total = max(p.total, p.completed + p.failed)
        p.percent = 100.0 if p.total else p.percent
        p.estimated_seconds_remaining = 0
    else:
        p.estimated_seconds_remaining = None
    p.images_per_second = None
    _summarise(status)


def _summarise(status: DiffusionJobStatus) -> None:
    p = status.progress
    p.summary = f"{p.completed}/{p.total}"
    p.eta = eta_text(p.estimated_seconds_remaining)


def _every_item_failed(status: DiffusionJobStatus) -> bool:
    p = status.progress
    return p.total > 0 and p.completed == 0 and p.failed >= p.total


def _create_job(t: Transition, job: DiffusionJob, now: datetime) -> Decision:
    """No Job: create it (once; it retries its own pods)."""
    st, par, policy = t.status, job.spec.parallelism, job.spec.run_policy
    t.act(CreateJob(deadline.remaining(st, policy, now)))
    t.condition("Created", True, "JobCreated", f"{par.nodes} pod(s) created")
    t.event("Normal", "JobCreated", f"created {par.nodes} pod(s), world size {par.world_size}")
    if suspension.created_suspended(policy):
        t.phase(Phase.SUSPENDED, *suspension.reason(policy))
    else:
        t.phase(Phase.PENDING, "Starting", f"0/{par.nodes} pod(s) running")
    return t.decision


def _running_message(job: DiffusionJob, indexes: ByIndex, running: int) -> tuple[str, str]:
    par, limit = job.spec.parallelism, job.spec.run_policy.max_restarts
    base = f"{par.nodes} pod(s), world size {par.world_size}"
    retrying = failure.retrying(indexes, limit)
    if not retrying:
        return "Running", base
    first = retrying[0]
    pod = first.last_failed
    why = failure.describe(pod) if pod is not None else "failed"
    more = f" (and {len(retrying) - 1} more)" if len(retrying) > 1 else ""
    return "Retrying", (f"{running}/{par.nodes} pod(s) running; index {first.index}{more} is retried "
                        f"({min(first.failures, limit)}/{limit}) after: {why}")


def decide(
    job: DiffusionJob, status: DiffusionJobStatus, generation: int | None, observed: Observed, now: datetime
) -> Decision:
    t = Transition(status, generation, now)
    st = t.status
    par, policy = job.spec.parallelism, job.spec.run_policy
    st.world_size, st.data_parallel_degree = par.world_size, par.data_parallel_degree
    st.output_path = job.output_path
    st.selector = pod_selector(job)
    apply_progress(st, observed.progress, job.total_images)
    apply_cache_verify(st, observed.pods)

    # 1. Finished jobs only wait for their time-to-live.
    if st.phase in TERMINAL_PHASES:
        finish_progress(st)
        gone = ttl.expired(st, policy, now)
        if gone:
            t.act(DeleteSelf(gone))
        return t.decision

    decision = _decide_running(t, job, observed, now)
    if st.phase in TERMINAL_PHASES:
        finish_progress(st)
        stall.reachability(t, None)  # no pod waits for its posts any more
    running = 0 if st.phase in TERMINAL_PHASES else sum(
        1 for s in by_index(observed.pods).values() if s.newest.phase == "Running" and not s.newest.deleting)
    cost.account(st, job, running, cost.price(job, observed.price_per_gpu_hour), now)
    return decision


def _decide_running(t: Transition, job: DiffusionJob, observed: Observed, now: datetime) -> Decision:
    st = t.status
    par, policy = job.spec.parallelism, job.spec.run_policy
    current, pods = observed.job, observed.pods

    # 2. The deadline counts from the first start.
    if deadline.exceeded(st, policy, now):
        t.phase(Phase.FAILED, REASON_DEADLINE, deadline.message(policy))
        if current is not None and not current.deleting:
            t.act(DeleteJob(REASON_DEADLINE))
        return t.decision

    # 3. No Job: create it. One being deleted (by someone else) goes first.
    if current is None:
        return _create_job(t, job, now)
    if current.deleting:
        t.phase(Phase.PENDING, "JobDeleted", "the Job is being deleted; it is created again once it is gone")
        return t.decision
    # Whether the pods' posts still arrive: silence is not a stall (policies/stall.py).
    silent = stall.reachability(t, stall.unreachable(job.spec, observed.progress, pods, now))

    # 4. What the job owns besides its Job: one that is gone is created again (its isolation, its
    #    pods' names and spec depend on them).
    restore(t, observed)

    # 5. The size asked for (a resize); suspension (by the user, or by Kueue until it admits the Job).
    resize.apply(t, job, current)
    pods = resize.in_range(pods, current)
    flip = suspension.action(policy, current)
    if flip is not None:
        t.act(flip)
    if suspension.is_suspended(policy, current):
        t.phase(Phase.SUSPENDED, *suspension.reason(policy))
        return t.decision

    # 6. Outcomes: the Job's, and each index's failures.
    if current.complete and _every_item_failed(st):
        # A runtime image from before runPolicy.maxFailedItems ends such a job with exit 0: a job
        # that made nothing is never Succeeded, whichever image ran it.
        p = st.progress
        t.phase(Phase.FAILED, REASON_ALL_ITEMS_FAILED,
                f"every item failed ({p.failed} of {p.total}); each item's error is in the manifest under "
                f"{_where(job)}")
        return t.decision
    if current.complete:
        t.phase(Phase.SUCCEEDED, "Completed", f"{max(st.progress.completed, st.progress.total - st.progress.failed)} "
                f"images in {_where(job)}")
        return t.decision
    if current.failed and current.failure_reason == REASON_DEADLINE:
        t.phase(Phase.FAILED, REASON_DEADLINE, deadline.message(policy))
        return t.decision
    indexes = by_index(pods)
    if failure.handle(t, job, current, pods, indexes):
        return t.decision

    # 7. Pods that have not started are named; one that waited past runPolicy.startTimeoutSeconds fails the job.
    found = start.waiting(pods, current, observed.events, observed.start_clocks, now)
    first = start.apply(t, policy, found, now)
    if st.phase == Phase.FAILED:
        return t.decision
    note = f"; {first.describe()}" if first is not None else ""

    # 8. Running, or still coming up; a world spanning pods starts again together; a pod that
    #    stopped progressing is retried alone.
    if current.start_time and not st.start_time:
        st.start_time = current.start_time
    for peer in world.peers_to_stop(par, pods, indexes):
        t.act(StopPod(peer.pod.name, peer.pod.uid, REASON_WORLD_FAILED, peer.note))
        t.event("Warning", REASON_WORLD_FAILED, f"index {peer.pod.index} (pod {peer.pod.name}): {peer.note}; "
                "deleting it, so that its world starts again together")
    for stalled in stall.stalled(job.spec, observed.progress, pods, now):
        why = stall.message(stalled)
        t.act(StopPod(stalled.pod.name, stalled.pod.uid, REASON_STALLED, why))
        t.event("Warning", REASON_STALLED, f"index {stalled.pod.index} (pod {stalled.pod.name}): {why}; deleting it, "
                "the Job retries it alone")
    running = sum(1 for s in indexes.values() if s.newest.phase == "Running" and not s.newest.deleting)
    done = sum(1 for s in indexes.values() if s.newest.phase == "Succeeded")
    reason, message = _running_message(job, indexes, running)
    if running + done >= par.nodes or current.ready >= par.nodes or st.phase == Phase.RUNNING:
        # Once running, a job stays Running while single indexes are retried or wait for Kueue.
        t.phase(Phase.RUNNING, reason, message + _gated_note(job, indexes, running) + note + silent)
    else:
        t.phase(Phase.PENDING, "Starting" if reason == "Running" else reason,
                (f"{running}/{par.nodes} pod(s) running" if reason == "Running" else message)
                + _gated_note(job, indexes, running) + note + silent)
    return t.decision


def restore(t: Transition, observed: Observed) -> None:
    """Children the job should have and does not own (observe: by owner uid) are created again."""
    if observed.children is None:
        return
    missing = tuple(sorted(observed.expected_children - observed.children))
    if not missing:
        return
    t.act(RestoreChildren(missing))
    t.event("Warning", REASON_CHILD_RESTORED,
            "; ".join(f"{kind} {name} was gone: created again" for kind, name in missing))


def _gated_note(job: DiffusionJob, indexes: ByIndex, running: int) -> str:
    """What a resize through Kueue's workload slices waits for: the pods of the new size are held
    back until Kueue admits it (the running ones go on)."""
    gated = sum(1 for s in indexes.values() if s.newest.gated and not s.newest.deleting)
    if not gated or not job.spec.run_policy.workload_slices:
        return ""
    return (f"; {gated} pod(s) wait for Kueue to admit {job.spec.parallelism.nodes} pod(s) from queue "
            f"{job.spec.run_policy.queue_name} ({running} running)")


def _where(job: DiffusionJob) -> str:
    """The job's output folder as its reader names it: the path in the volume, or the URI in object storage."""
    uri = job.spec.output.uri
    return join_uri(uri, job.output_path) if uri else job.output_path
