"""The pod is told to stop: SIGTERM (a resize that removes it, preemption, eviction, a drain).

Kubernetes signals the container's first process, the launch entry point; it does not pass the
signal to the launcher (torchrun would stop its workers with its own short deadline) but creates
the pod's drain file (MURALIST_DRAIN_FILE). Each rank looks for the file where stopping costs
nothing: before it claims a chunk, between batches, and while the first pod waits to merge. A
rank that finds it stops claiming, lets the writer threads finish what was rendered, hands its
unfinished chunk back to the store and ends with the Drained verdict (exit DRAINED_EXIT_CODE for
the pod). The item in flight finishes if the grace period allows (runPolicy.terminationGracePeriodSeconds);
otherwise the kubelet's SIGKILL abandons it, and only it. With runPolicy.checkpoint (onTerminate), the
ranks also look at the end of each denoising step: the item's state is saved there and the item stops
(`StoppedMidItem`), to resume where it was in whichever pod takes its chunk next.
"""

from __future__ import annotations

import os
from pathlib import Path

from muralist_api.contract.env import PodEnv


class Drained(Exception):
    """This rank stopped on request; its message says what it handed back."""


class StoppedMidItem(Drained):
    """Told to stop in the middle of an item whose denoising state was saved there (runPolicy.checkpoint's
    onTerminate): the claim loop hands the item's chunk back, and whoever takes it resumes the item."""


_seen = False


def requested() -> bool:
    """Whether this pod was told to stop (one stat per call, at batch boundaries; once true, always)."""
    global _seen
    if not _seen:
        path = PodEnv.from_environ().drain_file
        _seen = path is not None and os.path.exists(path)
    return _seen


def request(path: str | Path) -> None:
    """Tell the ranks to drain (the launch entry point, on SIGTERM)."""
    Path(path).touch()
