"""The clock thread: each job reconciled when something about it moves with time alone.

Each reconcile ends by saying when that is next (`Reconciler._track`), and the job waits in the
reconciler's priority queue (schedule.py) until then. The clock hands the jobs that are due to a
few worker threads (`CLOCK_WORKERS`), so a call that hangs holds one of them for its timeout,
never the clock; a job is never on two of them at once. Between reconciles it runs its chores
(peering checks, certificate renewal). Nothing while another replica reconciles (kopf's
peering pause) or before kopf has listed: the jobs due meanwhile wait their turn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from muralist_operator.indexes import Key
from muralist_operator.reconciler import Reconciler

log = logging.getLogger("muralist.operator")

# The chores run at least this often; reconciles run when due, whatever this says.
CHORE_SECONDS = 2.0
# Reconciles the clock runs at once: a call that hangs until its timeout holds one of them.
CLOCK_WORKERS = 4


class Clock:
    def __init__(self, reconciler: Reconciler, workers: int = CLOCK_WORKERS) -> None:
        self.reconciler = reconciler
        self.workers = workers
        # Things the clock thread does besides reconciling (TLS renewal, peering checks).
        self.chores: list[Callable[[], None]] = []
        # The jobs the clock is reconciling now, and whether one is due again once that is done.
        self._clocking: dict[Key, bool] = {}
        self._guard = threading.Lock()

    def _ready(self) -> bool:
        return self.reconciler.indexes.listed and self.reconciler.is_active()

    def run(self, stop: threading.Event) -> None:
        """Reconcile each job when it is due, on `workers` threads; run the chores in between,
        until `stop` is set (and the reconciler's wake with it, to end the wait)."""
        schedule = self.reconciler.schedule
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="muralist-clock-reconcile")
        try:
            while not stop.is_set():
                self._chores()
                schedule.wake.clear()  # before looking: a job due earlier from now on wakes the wait below
                due = schedule.next_due() if self._ready() else None
                wait = CHORE_SECONDS if due is None else min(CHORE_SECONDS, due - time.monotonic())
                if wait > 0:
                    schedule.wake.wait(wait)
                    if stop.is_set():
                        return
                if not self._ready():
                    continue
                for key in schedule.pop_due(time.monotonic()):
                    self._dispatch(pool, key)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _dispatch(self, pool: ThreadPoolExecutor, key: Key) -> None:
        """Reconcile `key` on the pool; if it is being reconciled by the clock already, once more
        after that (never two of the pool's threads on one job)."""
        with self._guard:
            if key in self._clocking:
                self._clocking[key] = True
                return
            self._clocking[key] = False
        pool.submit(self._reconcile_due, key)

    def _reconcile_due(self, key: Key) -> None:
        while True:
            self.reconciler.safe_reconcile(*key)
            with self._guard:
                if not self._clocking.get(key):
                    self._clocking.pop(key, None)
                    return
                self._clocking[key] = False

    def _chores(self) -> None:
        for chore in self.chores:
            try:
                chore()
            except Exception:
                log.exception("a periodic task of the operator failed")
