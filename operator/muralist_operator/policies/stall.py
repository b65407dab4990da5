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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from muralist_api.job import DiffusionJobSpec

from muralist_operator.observe import PodView
from muralist_operator.progress.aggregate import JobProgress

GAP_MULTIPLE = 10


@dataclass(frozen=True)
class Stalled:
    pod: PodView
    quiet: int  # seconds without progress
    timeout: int
    default: bool  # the timeout is the default (runPolicy.stallTimeoutSeconds unset)


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


def stalled(spec: DiffusionJobSpec, progress: JobProgress | None, pods: list[PodView], now: datetime) -> list[Stalled]:
    """The running pods over the timeout, quietest first."""
    if progress is None:
        return []
    limit = timeout(spec, progress)
    default = spec.run_policy.stall_timeout_seconds is None
    found: list[Stalled] = []
    for pod, last in _timed(progress, pods):
        quiet = int((now - last).total_seconds())
        if quiet > limit:
            found.append(Stalled(pod, quiet, limit, default))
    return sorted(found, key=lambda s: (-s.quiet, s.pod.index))


def next_check(spec: DiffusionJobSpec, progress: JobProgress | None, pods: list[PodView],
               now: datetime) -> datetime | None:
    """When a pod could next be over the timeout (the reconciler's wake-up); None while no
    running pod with work left has stepped. Progress meanwhile only moves it later: a check
    that comes early finds nothing and asks again."""
    timed = _timed(progress, pods) if progress is not None else []
    if progress is None or not timed:
        return None
    return max(now, min(last for _, last in timed) + timedelta(seconds=timeout(spec, progress) + 1))


def message(found: Stalled) -> str:
    if not found.default:
        return f"no progress for {found.quiet}s (runPolicy.stallTimeoutSeconds)"
    return (f"no progress for {found.quiet}s (runPolicy.stallTimeoutSeconds unset: the default, {found.timeout}s, "
            f"is {GAP_MULTIPLE}x the job's slowest gap between steps, at least parallelism.collectiveTimeoutSeconds)")
