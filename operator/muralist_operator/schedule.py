"""When the clock reconciles each job next: a priority queue of due times, one per job.

A job is in it only while something about it moves with time alone: a deadline or a TTL that
will pass, a pod that could pass its stall timeout, a check a policy asked for
(`Decision.check_again_at`), counts waiting for the status-write throttle, a retry after a failed
reconcile. A job that waits for nothing (finished without a TTL, or running with nothing timed)
costs the clock nothing. Times are on a monotonic clock (`time.monotonic`, or one a test moves).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Stale heap entries (of due times replaced since) beyond this many times the live ones, and
# the heap is rebuilt: replacing a far time by a near one leaves the far entry behind.
_COMPACT_FACTOR = 2


class Schedule(Generic[K]):
    """Thread-safe. `wake` is set whenever a due time earlier than every other one is added, so
    that a thread sleeping until the earliest one (`next_due`) wakes up and looks again."""

    def __init__(self) -> None:
        self._due: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0  # ties in time pop in insertion order, and keys are never compared
        self._lock = threading.Lock()
        self.wake = threading.Event()

    def at(self, key: K, when: float) -> None:
        """Due at `when`, unless it is due earlier already."""
        with self._lock:
            current = self._due.get(key)
            if current is not None and current <= when:
                return
            self._set(key, when)

    def replace(self, key: K, when: float | None) -> None:
        """Due exactly at `when` from now on (None: not at all), whatever was due before."""
        with self._lock:
            if when is None:
                self._due.pop(key, None)
            elif self._due.get(key) != when:
                self._set(key, when)

    def drop(self, key: K) -> None:
        self.replace(key, None)

    def when(self, key: K) -> float | None:
        with self._lock:
            return self._due.get(key)

    def next_due(self) -> float | None:
        """The earliest due time, None when nothing is due."""
        with self._lock:
            self._discard_stale()
            return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[K]:
        """The keys due at `now` or before, earliest first; they leave the queue."""
        found: list[K] = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                when, _, key = heapq.heappop(self._heap)
                if self._due.get(key) == when:
                    del self._due[key]
                    found.append(key)
        return found

    def __len__(self) -> int:
        with self._lock:
            return len(self._due)

    def _set(self, key: K, when: float) -> None:
        self._due[key] = when
        self._discard_stale()
        earliest = self._heap[0][0] if self._heap else None
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, key))
        if len(self._heap) > _COMPACT_FACTOR * len(self._due) + 64:
            self._heap = []
            for k, t in self._due.items():
                self._seq += 1
                self._heap.append((t, self._seq, k))
            heapq.heapify(self._heap)
        if earliest is None or when < earliest:
            self.wake.set()

    def _discard_stale(self) -> None:
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)


def backoff(failures: int, first: float = 1.0, cap: float = 60.0) -> float:
    """Seconds before the next try after `failures` failures in a row: 1, 2, 4, ... up to `cap`."""
    return float(min(cap, first * 2 ** max(0, failures - 1)))

