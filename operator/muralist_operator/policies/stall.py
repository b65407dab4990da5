"""runPolicy.stallTimeoutSeconds: a pod whose ranks stop making progress is deleted, and the Job
controller retries its index like any failure. Only that pod: the others keep rendering.

Progress is what the pods push (progress.aggregate): the last denoising step or image of the
index's current pod. The clock of a pod starts at its first step: loading and rendezvous have
their own guards (collectiveTimeoutSeconds, activeDeadlineSeconds) and vary too much with the
model and the node to share one timeout with a denoising step. A pod that said its work is done
(`done`) or sent its last post is quiet by right.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from muralist_runtime.spec.api import RunPolicy

from muralist_operator.observe import PodView
from muralist_operator.progress.aggregate import JobProgress


@dataclass(frozen=True)
class Stalled:
    pod: PodView
    quiet: int  # seconds without progress


def stalled(policy: RunPolicy, progress: JobProgress | None, pods: list[PodView], now: datetime) -> list[Stalled]:
    """The running pods over the timeout, quietest first."""
    timeout = policy.stall_timeout_seconds
    if timeout is None or progress is None:
        return []
    running = {(p.index, p.name): p for p in pods if p.phase == "Running" and not p.deleting}
    found: list[Stalled] = []
    for index, seen in progress.indexes.items():
        pod = running.get((index, seen.pod))
        if pod is None or seen.finished or seen.progress_time is None:
            continue  # a report of a pod that is gone (or not running yet), done, or still loading
        quiet = int((now - seen.progress_time).total_seconds())
        if quiet > timeout:
            found.append(Stalled(pod, quiet))
    return sorted(found, key=lambda s: (-s.quiet, s.pod.index))


def message(quiet: int) -> str:
    return f"no progress for {quiet}s (runPolicy.stallTimeoutSeconds)"
