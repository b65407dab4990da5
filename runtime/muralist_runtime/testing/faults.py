"""Failure injection for tests: a rank that dies or hangs after writing N images.

- MURALIST_TEST_EXIT_AFTER=N: a rank (MURALIST_TEST_EXIT_RANK, default 0; -1: whichever gets
  there first) `os._exit`s with TEST_KILLED_EXIT_CODE right after writing its N-th image,
  standing in for a killed pod.
- MURALIST_TEST_HANG_AFTER=N: a rank (MURALIST_TEST_HANG_RANK, default 0) blocks forever after
  its N-th image, standing in for a stuck rank (its heartbeat goes on, its steps stop).

With either set, each image is written before the next is rendered, so N is exact.
- MURALIST_TEST_NAN_ROWS=3,7: the outputs of those rows come out as NaN (a diverged sampler),
  so the per-item failure path runs for real.
- MURALIST_TEST_RAISE_ROWS=3: a pipeline call that renders row 3 raises a RuntimeError from its
  step callback, inside the call, every time: an item whose call fails (render/failures.py).
- MURALIST_TEST_OOM_ROWS=3: the same with torch.OutOfMemoryError, once per process per row: the
  call is retried once, alone, and renders.
- MURALIST_TEST_STEP_SLEEP=s with MURALIST_TEST_SLOW_RANK=r: rank r sleeps s seconds after every
  denoising step (a GPU half as fast) while its device sits idle: for tests that need a slow rank.
- MURALIST_TEST_RENDER_REPEAT=k with MURALIST_TEST_SLOW_RANK=r: rank r renders each batch k times
  (the first result kept, the others discarded), so its items cost k times the compute, as on a
  device 1/k as fast, and it loads the machine as such a device would (a sleep leaves its core to
  the other ranks): the straggler benchmark's slow rank. DataParallel only: in a group of several
  ranks the others would not join the extra renders' collectives.
- MURALIST_TEST_STATIC_PLAN=1: fixed contiguous shares instead of claimed chunks (the
  benchmark's comparison).
- MURALIST_TEST_KILL_AT_STEP=s: a rank with runPolicy.checkpoint SIGKILLs itself at the end of its s-th
  denoising step of job items (counted in the process), once that step's checkpoint (when due) and note are
  written: a pod killed in the step after, with nothing more of it told.
MURALIST_TEST_BREAK_CP is read by canary.py.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field

from muralist_api import contract
from muralist_api.contract.env import PodEnv, TestFaults

log = logging.getLogger("muralist")

# The knobs' variables: read on every call and every denoising step, so parsed once for each set of their values
# (PodEnv.from_environ reads the whole pod environment: ~40 us, ~1 % of a small item's time over its steps).
_KNOBS = tuple(value for name, value in vars(contract).items() if name.startswith("MURALIST_TEST_"))
_PARSED: dict[tuple[str | None, ...], TestFaults] = {}


def current() -> TestFaults:
    """The test knobs as the environment sets them now."""
    values = tuple(os.environ.get(name) for name in _KNOBS)
    found = _PARSED.get(values)
    if found is None:
        found = _PARSED[values] = PodEnv.from_environ().faults
    return found


@dataclass
class ImageCues:
    """The knobs that act on a rank's N-th written image (TestFaults: the one type of the test knobs, read
    from the environment by PodEnv), and this rank's count of written images."""

    faults: TestFaults = field(default_factory=lambda: current())
    written: int = 0

    @property
    def active(self) -> bool:
        return bool(self.faults.exit_after or self.faults.hang_after)

    def image_written(self, rank: int) -> None:
        self.written += 1
        f = self.faults
        if f.exit_after and self.written == f.exit_after and f.exit_rank in (rank, -1):
            os._exit(contract.TEST_KILLED_EXIT_CODE)
        if f.hang_after and self.written == f.hang_after and rank == f.hang_rank:
            log.warning("%s=%d: rank %d blocks forever", contract.MURALIST_TEST_HANG_AFTER, f.hang_after, rank)
            threading.Event().wait()


def nan_rows() -> frozenset[int]:
    return current().nan_rows


class InjectedFailure(RuntimeError):
    """MURALIST_TEST_RAISE_ROWS: a pipeline call's failure that is no world's."""


_OOM_RAISED: set[int] = set()


def raise_in_call(rows: list[int]) -> None:
    """From a step callback: fail the call as MURALIST_TEST_RAISE_ROWS / _OOM_ROWS say for its rows."""
    faults = current()
    if not (faults.raise_rows or faults.oom_rows):
        return
    hit = sorted(set(rows) & faults.raise_rows)
    if hit:
        raise InjectedFailure(f"{contract.MURALIST_TEST_RAISE_ROWS}: the call of row {hit[0]} fails")
    first = sorted((set(rows) & faults.oom_rows) - _OOM_RAISED)
    if first:
        import torch

        _OOM_RAISED.update(first)
        raise torch.OutOfMemoryError(f"{contract.MURALIST_TEST_OOM_ROWS}: row {first[0]} ran out of memory once")


def step_sleep(rank: int) -> float:
    """Seconds the slow rank sleeps after each step (0 for every other rank)."""
    faults = current()
    return faults.step_sleep if rank == faults.slow_rank else 0.0


def render_repeat(rank: int) -> int:
    """How many times the slow rank renders each batch (1 for every other rank)."""
    faults = current()
    return max(1, faults.render_repeat) if rank == faults.slow_rank else 1


def static_plan() -> bool:
    return current().static_plan


_STEPS_ENDED = [0]


def step_ended() -> None:
    """A denoising step of a job item ended (model/checkpointing.py): MURALIST_TEST_KILL_AT_STEP's moment."""
    kill_at = current().kill_at_step
    if not kill_at:
        return
    _STEPS_ENDED[0] += 1
    if _STEPS_ENDED[0] == kill_at:
        log.warning("%s=%d: this rank kills itself", contract.MURALIST_TEST_KILL_AT_STEP, kill_at)
        os.kill(os.getpid(), signal.SIGKILL)
