"""runPolicy.stallTimeoutSeconds: a pod whose ranks stop making progress is deleted, and the Job
controller retries its index like any failure. Only that pod: the others keep rendering.

Progress is what the pods push (progress.aggregate): the last denoising step or image of the
index's current pod. The clock of a pod starts at its first step: loading and rendezvous have
their own guards (collectiveTimeoutSeconds, activeDeadlineSeconds) and vary too much with the
model and the node to share one timeout with a denoising step. A pod that said its work is done
(`done`) or sent its last post is quiet by right.

Without a value the timeout is on all the same (no job waits forever on a hung rank):
GAP_MULTIPLE times the slowest gap between two signs of progress of one pod that this operator
has seen in the job, and at least parallelism.collectiveTimeoutSeconds (the time the job
already grants a stuck rank before its group fails). A model whose steps take minutes gets
a timeout of tens of minutes; a fast image model, the collective timeout (10 minutes by
default). There is no switch to turn it off: a pod that makes no progress for a large
explicit value is stuck by any measure.

Silence is not a stall. The operator knows a pod's progress only from its posts, and posts
stop for reasons of the cluster's as well (a NetworkPolicy or Service change, a CA the pods no
longer trust, TokenReview failing): deleting every pod then would only burn maxRestarts. So:

- When no post of the job has been accepted for the timeout while pods of it run with work
  left, the endpoint is what is unreachable (`unreachable`): the job gets the condition
  ProgressUnreachable (with the last error the endpoint saw for the job: a refused token, a
  TokenReview that failed, a body refused) and a Warning Event, nothing is deleted, and no pod
  of it is stalled. The silence counts from the last accepted post, provided a pod running now
  has posted (pods new since, after a resume or a retry, may still be starting), else from the
  first post refused since that one. A job none of whose posts ever reached this operator,
  accepted or refused, gets no verdict: a pod that cannot reach the endpoint from its start
  looks the same as one still starting, and a pod's stall clock starts at its first step
  anyway. The condition clears (ProgressReceived) once a post is accepted again, or no pod
  runs with work left.
- A pod is stalled once it has gone the timeout without a step and a post of the job was
  accepted after that: the posts kept arriving. So a pod that keeps posting without stepping
  is stalled, as is a silent pod among pods that post: the endpoint is evidently reachable from
  the job's pods, so this one is stuck (or its own node's network is, which a retry elsewhere
  fixes as well as anything). A pod over the timeout with no post of the job since waits: for
  the next post (`awaits_post`: the reconciler wakes the job with it), or for the silence to
  last the timeout. After a break in the job's posts (progress.aggregate: `reachable_since`)
  each pod's clock starts again where the posts resumed: when a blocked endpoint comes back,
  the pod whose post arrives first does not make the others look stalled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from muralist_api.job import DiffusionJobSpec

from muralist_operator.decision import Transition, find_condition, iso
from muralist_operator.observe import PodView
from muralist_operator.progress.snapshot import JobProgress, PostError

GAP_MULTIPLE = 10
CONDITION_UNREACHABLE = "ProgressUnreachable"
REASON_UNREACHABLE = "ProgressUnreachable"
REASON_RECEIVED = "ProgressReceived"


@dataclass(frozen=True)
class Stalled:
    pod: PodView
    quiet: int  # seconds without progress
    timeout: int
    default: bool  # the timeout is the default (runPolicy.stallTimeoutSeconds unset)


@dataclass(frozen=True)
class Unreachable:
    """The job's posts have stopped arriving: no stall, a condition."""

    since: datetime  # the last accepted post of the job, or the first refused one after it
    timeout: int
    default: bool
    running: int  # pods running with work left
    last_error: PostError | None  # the last post the endpoint refused for the job


def default_timeout(floor: int, slowest_gap_seconds: float | None) -> int:
    """The timeout when the user set none: GAP_MULTIPLE x the slowest gap, at least `floor`."""
    return max(floor, math.ceil(GAP_MULTIPLE * (slowest_gap_seconds or 0.0)))


def timeout(spec: DiffusionJobSpec, progress: JobProgress | None) -> int:
    """runPolicy.stallTimeoutSeconds when set (an explicit value wins), else the default."""
    explicit = spec.run_policy.stall_timeout_seconds
    if explicit is not None:
        return explicit
    gap = progress.slowest_gap_seconds if progress is not None else None
    return default_timeout(spec.parallelism.collective_timeout_seconds, gap)


def _working(progress: JobProgress, pods: list[PodView]) -> list[PodView]:
    """The running pods that have not said their work is done."""
    finished = {(i, seen.pod) for i, seen in progress.indexes.items() if seen.finished}
    return [p for p in pods if p.phase == "Running" and not p.deleting and (p.index, p.name) not in finished]


def _silent_since(progress: JobProgress, working: list[PodView]) -> datetime | None:
    """Since when no post of the job has been accepted, as far as this operator can tell (see
    the module's docstring); None: no verdict."""
    if not working:
        return None
    posted = {(i, seen.pod) for i, seen in progress.indexes.items() if seen.posted_at is not None}
    accepted = progress.last_post if any((p.index, p.name) in posted for p in working) else None
    # A refusal comes after the last accepted post (an accepted one clears it): the earlier counts.
    return min((t for t in (accepted, progress.refused_since) if t is not None), default=None)


def unreachable(spec: DiffusionJobSpec, progress: JobProgress | None, pods: list[PodView],
                now: datetime) -> Unreachable | None:
    """Whether the job's posts have stopped arriving for the stall timeout while its pods run."""
    if progress is None:
        return None
    working = _working(progress, pods)
    since = _silent_since(progress, working)
    limit = timeout(spec, progress)
    if since is None or (now - since).total_seconds() <= limit:
        return None
    return Unreachable(since, limit, spec.run_policy.stall_timeout_seconds is None, len(working),
                       progress.last_error)


def _timed(progress: JobProgress, pods: list[PodView]) -> list[tuple[PodView, datetime]]:
    """The running pods that stepped and have work left, with their last progress."""
    running = {(p.index, p.name): p for p in pods if p.phase == "Running" and not p.deleting}
    found = []
    for index, seen in progress.indexes.items():
        pod = running.get((index, seen.pod))
        if pod is None or seen.finished or seen.progress_time is None:
            continue  # a report of a pod that is gone (or not running yet), done, or still loading
        found.append((pod, seen.progress_time))
    return found


def _clock_start(progress: JobProgress, last_step: datetime) -> datetime:
    """Where a pod's stall clock starts: its last step, or the end of a break in the job's posts
    after it (the pod gets the whole timeout to be heard from again)."""
    resumed = progress.reachable_since
    return last_step if resumed is None else max(last_step, resumed)


def _over(spec: DiffusionJobSpec, progress: JobProgress, pods: list[PodView],
          now: datetime) -> list[tuple[PodView, int, bool]]:
    """The running pods that have gone the timeout without a step: (pod, seconds without a step,
    whether a post of the job was accepted after the timeout had passed for it)."""
    limit = timeout(spec, progress)
    found = []
    for pod, last in _timed(progress, pods):
        start = _clock_start(progress, last)
        if (now - start).total_seconds() > limit:
            heard = progress.last_post is not None and progress.last_post > start + timedelta(seconds=limit)
            found.append((pod, int((now - last).total_seconds()), heard))
    return found


def stalled(spec: DiffusionJobSpec, progress: JobProgress | None, pods: list[PodView], now: datetime) -> list[Stalled]:
    """The running pods over the timeout while the job's posts kept arriving, quietest first."""
    if progress is None or unreachable(spec, progress, pods, now) is not None:
        return []
    limit, default = timeout(spec, progress), spec.run_policy.stall_timeout_seconds is None
    found = [Stalled(pod, quiet, limit, default) for pod, quiet, heard in _over(spec, progress, pods, now) if heard]
    return sorted(found, key=lambda s: (-s.quiet, s.pod.index))


def awaits_post(spec: DiffusionJobSpec, progress: JobProgress | None, pods: list[PodView], now: datetime) -> bool:
    """Whether the job's next accepted post decides something: it clears ProgressUnreachable, or
    shows that a pod over the timeout is stalled (posts arrive, its steps do not)."""
    if progress is None:
        return False
    return unreachable(spec, progress, pods, now) is not None or any(
        not heard for _, _, heard in _over(spec, progress, pods, now))


def next_check(spec: DiffusionJobSpec, progress: JobProgress | None, pods: list[PodView],
               now: datetime) -> datetime | None:
    """When a pod could next be over the timeout, or the job's posts silent for it (the
    reconciler's wake-up); None while neither can happen, and while the posts are silent already
    (the next accepted post wakes the job: `awaits_post`). Progress meanwhile only moves it
    later: a check that comes early finds nothing and asks again."""
    if progress is None or unreachable(spec, progress, pods, now) is not None:
        return None
    limit = timeout(spec, progress)
    times = [_clock_start(progress, last) + timedelta(seconds=limit + 1) for _, last in _timed(progress, pods)]
    since = _silent_since(progress, _working(progress, pods))
    if since is not None:
        times.append(since + timedelta(seconds=limit + 1))
    later = [t for t in times if t > now]  # overdue pods wait for a post (awaits_post) or the silence
    if not later:
        return None
    return min(later)


def message(found: Stalled) -> str:
    if not found.default:
        return f"no progress for {found.quiet}s (runPolicy.stallTimeoutSeconds)"
    return (f"no progress for {found.quiet}s (runPolicy.stallTimeoutSeconds unset: the default, {found.timeout}s, "
            f"is {GAP_MULTIPLE}x the job's slowest gap between steps, at least parallelism.collectiveTimeoutSeconds)")


def unreachable_message(found: Unreachable) -> str:
    """What the condition and the Event say: stable while nothing changes (no running count of
    seconds), so that a check does not rewrite status."""
    timeout_ = (f"runPolicy.stallTimeoutSeconds={found.timeout}s" if not found.default
                else f"the stall timeout, {found.timeout}s")
    error = (f"the last post the progress endpoint refused for this job: {found.last_error.describe()}"
             if found.last_error is not None else
             "no post of the job reached the progress endpoint since (check NetworkPolicies between the pods and "
             "the operator, the progress Service and its endpoints, and the CA the pods trust)")
    return (f"no progress post of this job's {found.running} running pod(s) has been accepted since "
            f"{iso(found.since)}, longer than {timeout_}; its pods are not deleted while their posts do not "
            f"arrive; {error}")


def reachability(t: Transition, found: Unreachable | None) -> str:
    """The ProgressUnreachable condition from `unreachable`'s verdict, with a Warning Event when it
    turns True and a Normal one when it clears; returns the note for the phase's message ("" while
    posts arrive)."""
    existing = find_condition(t.status.conditions, CONDITION_UNREACHABLE)
    was = existing is not None and existing.status == "True"
    if found is not None:
        text = unreachable_message(found)
        t.condition(CONDITION_UNREACHABLE, True, REASON_UNREACHABLE, text)
        if not was:
            t.event("Warning", REASON_UNREACHABLE, text)
        error = f"; last refused: {found.last_error.describe()}" if found.last_error is not None else ""
        return f"; progress unreachable: no post accepted since {iso(found.since)}{error}"
    if was:
        message = "progress posts of the job's pods are accepted again, or none of its pods runs with work left"
        t.condition(CONDITION_UNREACHABLE, False, REASON_RECEIVED, message)
        t.event("Normal", REASON_RECEIVED, message)
    return ""
