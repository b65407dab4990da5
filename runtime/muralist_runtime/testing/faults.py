"""Failure injection for tests: a rank that dies or hangs after writing N images.

- MURALIST_TEST_EXIT_AFTER=N: a rank (MURALIST_TEST_EXIT_RANK, default 0; -1: whichever gets
  there first) `os._exit`s with TEST_KILLED_EXIT_CODE right after writing its N-th image,
  standing in for a killed pod.
- MURALIST_TEST_HANG_AFTER=N: a rank (MURALIST_TEST_HANG_RANK, default 0) blocks forever after
  its N-th image, standing in for a stuck rank (its heartbeat goes on, its steps stop).

With either set, each image is written before the next is rendered, so N is exact.
- MURALIST_TEST_NAN_ROWS=3,7: the outputs of those rows come out as NaN (a diverged sampler),
  so the per-item failure path runs for real.
- MURALIST_TEST_STEP_SLEEP=s with MURALIST_TEST_SLOW_RANK=r: rank r sleeps s seconds after every
  denoising step (a GPU half as fast), for the straggler benchmark.
- MURALIST_TEST_STATIC_PLAN=1: fixed contiguous shares instead of claimed chunks (the
  benchmark's comparison).
MURALIST_TEST_BREAK_CP is read by canary.py.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from muralist_api import contract

log = logging.getLogger("muralist")


@dataclass
class TestKnobs:
    __test__ = False  # not a pytest class
    exit_after: int = 0
    exit_rank: int = 0
    hang_after: int = 0
    hang_rank: int = 0
    written: int = 0

    @classmethod
    def from_env(cls) -> TestKnobs:
        def num(name: str) -> int:
            return int(os.environ.get(name, "0") or 0)

        return cls(num(contract.MURALIST_TEST_EXIT_AFTER), num(contract.MURALIST_TEST_EXIT_RANK),
                   num(contract.MURALIST_TEST_HANG_AFTER), num(contract.MURALIST_TEST_HANG_RANK))

    @property
    def active(self) -> bool:
        return bool(self.exit_after or self.hang_after)

    def image_written(self, rank: int) -> None:
        self.written += 1
        if self.exit_after and self.written == self.exit_after and self.exit_rank in (rank, -1):
            os._exit(contract.TEST_KILLED_EXIT_CODE)
        if self.hang_after and self.written == self.hang_after and rank == self.hang_rank:
            log.warning("%s=%d: rank %d blocks forever", contract.MURALIST_TEST_HANG_AFTER, self.hang_after, rank)
            threading.Event().wait()


def nan_rows() -> frozenset[int]:
    raw = os.environ.get(contract.MURALIST_TEST_NAN_ROWS, "")
    return frozenset(int(x) for x in raw.split(",") if x.strip())


def step_sleep(rank: int) -> float:
    """Seconds the slow rank sleeps after each step (0 for every other rank)."""
    seconds = float(os.environ.get(contract.MURALIST_TEST_STEP_SLEEP, "0") or 0)
    slow = int(os.environ.get(contract.MURALIST_TEST_SLOW_RANK, "-1") or -1)
    return seconds if rank == slow else 0.0


def static_plan() -> bool:
    return os.environ.get(contract.MURALIST_TEST_STATIC_PLAN) == "1"
