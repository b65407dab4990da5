"""Rank files: what each rank of a pod has done, kept where the pod's other processes can read it.

Every rank keeps its counts in a small JSON file in its pod's progress directory (`RankFile`,
MURALIST_PROGRESS_DIR or /tmp/muralist-progress): readable without a collective, so the pod's
reporter (push.py), `muralist run`'s whole-job bar and the end-of-pod watchdog (`wait_for_pod`)
all work from the same files. Stall detection: each file carries `last_step_time` (the last
denoising step, from the pipeline's step callback, on every rank of a group), `last_image_time`
(the last item on disk) and `done` once the rank has no more work: a done rank's silence is no
stall.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from muralist_api.contract import Counts
from muralist_api.contract.env import PodEnv
from muralist_api.step_cache import CacheSample

from ..outputs import temps

log = logging.getLogger("muralist.progress")

DEFAULT_PROGRESS_DIR = "/tmp/muralist-progress"
RANK_FILE_INTERVAL_SECONDS = 0.5


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class RankState:
    """What one rank has done: its counts, the job's total, and its last signs of progress."""

    counts: Counts = field(default_factory=Counts)
    job_total: int = 0
    last_step_time: str | None = None
    last_image_time: str | None = None
    done: bool = False
    cache_sample: CacheSample | None = None  # generation.cache.verify's items this rank measured
    # Waiting for work that may never come (chunks handed back at the end): quiet by right, like a
    # done rank, for the stall policy; not done, for its pod's first rank, which waits for it.
    idle: bool = False
    # This rank's peak memory so far and how it was measured (report/peak_memory.py), for the job file.
    peak_memory_mib: float | None = None
    peak_measured_by: str = ""

    def to_json(self) -> str:
        doc = {**asdict(self.counts), "jobTotal": self.job_total, "lastStepTime": self.last_step_time,
               "lastImageTime": self.last_image_time, "done": self.done, "idle": self.idle}
        if self.cache_sample is not None:
            doc["cacheVerify"] = self.cache_sample.to_wire()
        if self.peak_memory_mib is not None:
            doc["peakMemoryMiB"], doc["peakMeasuredBy"] = round(self.peak_memory_mib, 1), self.peak_measured_by
        return json.dumps(doc)

    @classmethod
    def parse(cls, text: str) -> RankState:
        doc = json.loads(text)
        return cls(Counts(*(int(doc.get(k, 0)) for k in ("completed", "skipped", "failed", "total", "rerendered"))),
                   int(doc.get("jobTotal", 0)), doc.get("lastStepTime"), doc.get("lastImageTime"),
                   bool(doc.get("done")), CacheSample.from_wire(doc.get("cacheVerify")), bool(doc.get("idle")),
                   doc.get("peakMemoryMiB"), str(doc.get("peakMeasuredBy") or ""))


def progress_dir(env: dict[str, str] | None = None) -> Path:
    return Path(PodEnv.from_environ(env).progress_dir or DEFAULT_PROGRESS_DIR)


class RankFile:
    """This rank's state as `rank-<r>.json` in the pod's progress directory.

    Updates are cheap (a step calls one): a daemon thread writes the latest state at most every
    `interval`, atomically. Being a thread of its own, it also gets the last state out of a rank
    whose main thread hangs, so a stall shows as a stall (steps that stopped), not as a rank
    that never started.
    """

    def __init__(self, directory: Path, rank: int, interval: float = RANK_FILE_INTERVAL_SECONDS):
        self.path = directory / f"rank-{rank}.json"
        self.interval = interval
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: str | None = None
        self._stop = threading.Event()
        directory.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="muralist-rank-file", daemon=True)
        self._thread.start()

    def update(self, state: RankState, force: bool = False) -> None:
        text = state.to_json()
        if force:
            with self._lock:
                self._pending = None
            self._write(text)
            return
        with self._lock:
            self._pending = text

    def _write(self, text: str) -> None:
        try:
            with self._write_lock:  # a forced update and the thread's own: one temp name per process
                temps.write_atomic(self.path, text.encode(), fsync=False)
        except OSError as e:  # progress must never break generation
            log.warning("cannot write %s: %s", self.path, e)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                text, self._pending = self._pending, None
            if text is not None:
                self._write(text)

    def close(self) -> None:
        self._stop.set()


@dataclass
class PodState:
    """The sum of a pod's (or several pods') rank files."""

    counts: Counts = field(default_factory=Counts)
    ranks: int = 0
    last_step_time: str | None = None
    last_image_time: str | None = None
    done: bool = True
    cache_sample: CacheSample | None = None
    quiet: bool = True  # every rank done or idle: no progress is expected of the pod


def read_pod(directories: list[Path]) -> PodState:
    """Sum every rank file in these directories (unreadable ones skipped); total = the job's."""
    pod = PodState()
    for directory in directories:
        for path in directory.glob("rank-*.json"):
            try:
                one = RankState.parse(path.read_text())
            except (OSError, ValueError, TypeError):
                continue  # a torn write: the next read has it
            pod.ranks += 1
            pod.counts.completed += one.counts.completed
            pod.counts.skipped += one.counts.skipped
            pod.counts.failed += one.counts.failed
            pod.counts.rerendered += one.counts.rerendered
            pod.counts.total = max(pod.counts.total, one.job_total)
            pod.last_step_time = max(filter(None, (pod.last_step_time, one.last_step_time)), default=None)
            pod.last_image_time = max(filter(None, (pod.last_image_time, one.last_image_time)), default=None)
            pod.done = pod.done and one.done
            pod.quiet = pod.quiet and (one.done or one.idle)
            if one.cache_sample is not None:
                pod.cache_sample = one.cache_sample.combine(pod.cache_sample)
    pod.done = pod.done and pod.ranks > 0
    pod.quiet = pod.quiet and pod.ranks > 0
    return pod


def read_peaks(directory: Path) -> tuple[dict[str, float], str]:
    """Each rank's peak memory in this pod's progress directory, by rank, and how it was measured."""
    peaks: dict[str, float] = {}
    by = ""
    for path in sorted(directory.glob("rank-*.json")):
        try:
            one = RankState.parse(path.read_text())
        except (OSError, ValueError, TypeError):
            continue
        if one.peak_memory_mib is not None:
            peaks[path.stem.removeprefix("rank-")] = float(one.peak_memory_mib)
            by = by or one.peak_measured_by
    return dict(sorted(peaks.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)), by


def memory_reader(directory: Path, estimate: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """What the job file's `memory` says when the merge writes it: the layout's estimate (plan/confirm.py)
    beside each of this pod's ranks' measured peaks, read then (the ranks have finished their items)."""
    def record() -> dict[str, Any]:
        peaks, by = read_peaks(directory)
        return {**estimate, "measuredPeakMiB": peaks, "measuredBy": by} if peaks or estimate else {}
    return record


def read_counts(directories: list[Path]) -> Counts:
    return read_pod(directories).counts


class RankStalled(RuntimeError):
    """A rank of this pod stopped making progress: the pod fails (retryable) instead of hanging."""


def pending_ranks(directory: Path, timeout: float) -> int:
    """This pod's ranks not done yet; raise RankStalled when one of them has not moved (no step,
    no item: its rank file untouched) for `timeout` seconds."""
    pending = 0
    for path in sorted(directory.glob("rank-*.json")):
        try:
            state, moved = RankState.parse(path.read_text()), path.stat().st_mtime
        except (OSError, ValueError, TypeError):
            continue
        if state.done:
            continue
        pending += 1
        if (quiet := time.time() - moved) > timeout:
            raise RankStalled(f"{path.stem} of this pod made no progress for {quiet:.0f}s "
                              "(parallelism.collectiveTimeoutSeconds): failing the pod so it is retried")
    return pending


def stall_watch(directory: Path, timeout: float) -> Callable[[object], int]:
    """pending_ranks as a waiting loop's callback (it passes what it waits for, unused here)."""
    def pending(_waited_for: object) -> int:
        return pending_ranks(directory, timeout)
    return pending


def wait_for_pod(directory: Path, timeout: float, poll: float = 0.1) -> None:
    """Until every rank of this pod says it is done (pending_ranks raises on a stalled one).

    Ranks of a pod share no collective at the end, so without this a hung rank would keep the
    pod alive, and the chunk it holds unfinished, forever.
    """
    while pending_ranks(directory, timeout):
        time.sleep(poll)
