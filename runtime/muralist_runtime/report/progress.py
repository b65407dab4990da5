"""A rank's progress as it renders: its counts, a JSON line per finished item, its rank file.

`RankProgress` is what the claim/render loop talks to. Pods print one line per finished item on
stdout (`MURALIST_PROGRESS {json}`) for machines reading the logs; every rank, writer or not,
keeps its rank file (rank_files.py) current from the pipeline's step callback, which the pod's
reporter (push.py) and `muralist run`'s whole-job bar read, with its peak memory so far
(peak_memory.py), which the job file records. `start` sets both up for a rank.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from muralist_api.contract import PROGRESS_LINE_PREFIX, Counts
from muralist_api.contract.env import PodEnv
from muralist_api.step_cache import CacheSample

from ..world.distributed import Layout
from . import peak_memory
from .push import PodReporter, target_from_env
from .rank_files import RankFile, RankState, now_iso, progress_dir


def start(layout: Layout, job_total: int) -> tuple[PodReporter | None, RankProgress]:
    """This rank's progress, and the pod's reporter on its first local rank (None on the others).

    Started before the model loads: that takes minutes, and a silent pod would look stalled to
    the operator.
    """
    directory = progress_dir()
    target = target_from_env()
    reporter = None
    if target is not None and layout.local_rank == 0:
        reporter = PodReporter(target, directory).start()
    local = PodEnv.from_environ().local
    return reporter, RankProgress(layout.rank, job_total, layout.writes_images, local=local,
                                  rank_file=RankFile(directory, layout.rank))


# How often a step or an item notes the peak memory. The figure is a high-water mark, so a later reading holds an
# earlier peak, and the end reads it: read per step it cost more than the step callback's other work (16 us of
# /proc a step, 9 times an item).
PEAK_EVERY_SECONDS = 1.0


class RankProgress:
    """What main.py talks to: counts, JSON lines and the rank file together."""

    def __init__(self, rank: int, job_total: int, writes: bool, local: bool, rank_file: RankFile | None = None):
        self.rank = rank
        self.writes = writes
        self.state = RankState(Counts(total=job_total if writes else 0), job_total=job_total)
        self.local = local
        self.rank_file = rank_file
        self.steps = 0
        self.slowest_item_seconds = 0.0  # what the merge's wait bound scales with
        self._peak_noted = float("-inf")
        self._closed = False
        if rank_file is not None:
            rank_file.update(self.state, force=True)

    @property
    def counts(self) -> Counts:
        return self.state.counts

    def _note_peak_now_and_then(self) -> None:
        if time.monotonic() - self._peak_noted >= PEAK_EVERY_SECONDS:
            self._note_peak()

    def _note_peak(self) -> None:
        self._peak_noted = time.monotonic()
        self.state.peak_memory_mib, self.state.peak_measured_by = peak_memory.peak_mib()

    def item_done(self, key: str, status: str, seconds: float, rerendered: bool = False) -> None:
        """An item finished: "completed" (rendered now; `rerendered`: in place of one made for another
        request), "skipped" (kept from before) or "failed"."""
        if not self.writes:
            return
        self._note_peak_now_and_then()  # its decode, after its last step
        counts = self.state.counts
        if status == "completed":
            counts.completed += 1
            counts.rerendered += rerendered
            self.slowest_item_seconds = max(self.slowest_item_seconds, seconds)
        elif status == "skipped":
            counts.skipped += 1
        else:
            counts.failed += 1
        self.state.last_image_time = now_iso()
        if not self.local:
            line = {"event": status, "key": key, "rank": self.rank, **asdict(counts), "seconds": round(seconds, 4)}
            sys.stdout.write(PROGRESS_LINE_PREFIX + json.dumps(line) + "\n")
            sys.stdout.flush()
        if self.rank_file is not None:
            self.rank_file.update(self.state)

    def cache_measured(self, sample: CacheSample) -> None:
        """generation.cache.verify's items this rank measured so far (the termination message sums the pod's)."""
        self.state.cache_sample = sample
        if self.rank_file is not None:
            self.rank_file.update(self.state, force=True)

    def step_done(self) -> None:
        """Called by the pipeline's step callback on every rank (writers or not)."""
        self.steps += 1
        self.state.last_step_time = now_iso()
        self._note_peak_now_and_then()
        if self.rank_file is not None:
            self.rank_file.update(self.state)

    def idle(self, waiting: bool) -> None:
        """This rank waits for work that may never come (the first pod's groups at the end of a
        job, for chunks handed back): quiet by right while it waits, though not done."""
        self.state.idle = waiting
        if self.rank_file is not None:
            self.rank_file.update(self.state, force=True)

    def finished(self) -> None:
        """This rank has no more work: its silence from now on is expected."""
        self.state.done = True
        self._note_peak()
        if self.rank_file is not None:
            self.rank_file.update(self.state, force=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.rank_file is not None:
            self.rank_file.update(self.state, force=True)
            self.rank_file.close()
