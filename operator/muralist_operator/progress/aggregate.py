"""Job progress from the pods' reports, in memory: totals, percent, rate, ETA, and a write throttle.
What it says of a job at one moment (`snapshot`) is a snapshot.JobProgress.

Pure (no I/O, an injected clock): the server thread records reports, the reconciler reads
snapshots and asks `due()` before writing status, so 1,000 pods posting every few seconds
still mean at most one status write per job per `write_interval`.

Per completion index the newest pod wins: a report of a newer attempt (or of a new pod that
replaced the index's pod) takes the index over, and a late post of a retired pod is ignored.
What earlier pods of the index finished stays counted (`floor`): the next attempt skips those
images on disk, but only says so as it reaches them.

It also keeps the job's slowest gap: the longest a pod went from one sign of progress to the
next (a step, an image) while it worked, as its posts showed it. The default stall timeout is a
multiple of it (policies/stall.py): a model whose steps take minutes is not a stalled one.

And whether the pods' posts reach the endpoint at all: when each pod's last post was accepted
(`posted_at`, on the wall clock: a termination message is no post), the job's last accepted
post, when its posts resumed after their latest break (`reachable_since`: a gap of more than
BREAK_INTERVALS post intervals between two accepted posts of the job is one), and the last post
the endpoint refused for the job (`refused`: a TokenReview that failed, a token or body
refused) and since when the refusals have gone on. Stall detection tells a pod that stopped
stepping from a job whose posts stopped arriving by these (policies/stall.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from muralist_api.contract.progress import DEFAULT_POST_INTERVAL_SECONDS, ProgressReport

from muralist_operator.progress.snapshot import IndexProgress, JobProgress, PostError

JobKey = tuple[str, str]  # (namespace, name)

RATE_WINDOW_SECONDS = 60.0
WRITE_INTERVAL_SECONDS = 1.0
# Posts per second one replica is meant to absorb; beyond it pods are told to post less often.
# 300: 1,024 pods post every 3.5 s, which keeps both the server's CPU (~8 % of a core) and the
# status lag (interval + write interval, ~4.6 s at worst) within their targets
# (benchmarks/progress_load.py).
POST_BUDGET_PER_SECOND = 300.0
MAX_POST_INTERVAL_SECONDS = 30
# Intervals are told in half seconds: whole seconds would make 1,024 pods post every 4 s, and
# 4 s + the write interval is the whole 5 s the status may lag.
POST_INTERVAL_STEP_SECONDS = 0.5
# Rate samples closer together than this are merged: a window holds ~60 samples, not one per post.
_SAMPLE_RESOLUTION = 1.0
# A refusal's reason is kept this long at most (it names a field of the body, a token's error).
MAX_ERROR_CHARS = 300
# No accepted post of a job for this many post intervals (plus BREAK_SLACK_SECONDS) is a break in
# its posts: each pod posts once an interval, so a job's posts come at least that often.
BREAK_INTERVALS = 2
BREAK_SLACK_SECONDS = 2.0


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Slot:
    report: ProgressReport
    received: float
    posted_at: datetime | None = None
    floor: int = 0
    retired: set[str] = field(default_factory=set)
    # Kept until the next post of this index: a snapshot a second of 1,024 indexes then
    # rebuilds only the quarter that posted since (it was a tenth of the endpoint's CPU).
    _view: IndexProgress | None = None

    @property
    def done(self) -> int:
        return max(self.floor, self.report.items_done)

    def view(self) -> IndexProgress:
        if self._view is None:
            r = self.report
            self._view = IndexProgress(r.index, r.pod, r.attempt, self.done, r.failed, r.total, r.progress_time,
                                       self.posted_at, r.final, r.finished)
        return self._view


@dataclass
class _Job:
    first_seen: float
    slots: dict[int, _Slot] = field(default_factory=dict)
    known_total: int | None = None
    # Images rendered while we watched (skipped ones excluded): the rate's numerator only grows.
    rendered: int = 0
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    dirty: bool = True
    # Counts changes so far: a status write clears `dirty` only for the changes it had read, so
    # a report that lands while a reconcile writes an older snapshot is written next time.
    changes: int = 0
    last_write: float | None = None
    slowest_gap: float | None = None
    last_post: datetime | None = None
    reachable_since: datetime | None = None
    last_error: PostError | None = None
    refused_since: datetime | None = None

    def counts(self) -> tuple[int, int, int]:
        done = sum(s.done for s in self.slots.values())
        failed = sum(s.report.failed for s in self.slots.values())
        # Every pod reports the job's total (items are claimed at run time, not pre-assigned).
        total = self.known_total if self.known_total is not None else max(
            (s.report.total for s in self.slots.values()), default=0)
        return done, failed, total


def _merge(old: ProgressReport, new: ProgressReport) -> ProgressReport:
    """Cumulative counters never go down, so the field-wise max is right whatever order posts arrive in."""
    def later(a: datetime | None, b: datetime | None) -> datetime | None:
        return max(filter(None, (a, b)), default=None)

    # Both were validated when they arrived: the merge of valid reports is one, no need to check again.
    return ProgressReport.model_construct(
        pod=new.pod, index=new.index, attempt=new.attempt, ranks=new.ranks,
        completed=max(old.completed, new.completed), skipped=max(old.skipped, new.skipped),
        failed=max(old.failed, new.failed), total=new.total, rerendered=max(old.rerendered, new.rerendered),
        last_step_time=later(old.last_step_time, new.last_step_time),
        last_image_time=later(old.last_image_time, new.last_image_time),
        sent_at=max(old.sent_at, new.sent_at), final=old.final or new.final,
        finished=old.finished or new.finished,
    )


def _note_gap(state: _Job, old: ProgressReport, new: ProgressReport) -> None:
    """The gap between a pod's last two signs of progress, when it moved on while working."""
    before, after = old.progress_time, new.progress_time
    if before is None or after is None or after <= before or old.finished:
        return
    gap = (after - before).total_seconds()
    if state.slowest_gap is None or gap > state.slowest_gap:
        state.slowest_gap = gap


def post_interval(active_pods: int, budget_per_second: float = POST_BUDGET_PER_SECOND) -> float:
    """How often each pod should post so that all of them together stay within the budget
    (rounded up to the interval step)."""
    if budget_per_second <= 0:
        return MAX_POST_INTERVAL_SECONDS
    needed = math.ceil(active_pods / budget_per_second / POST_INTERVAL_STEP_SECONDS) * POST_INTERVAL_STEP_SECONDS
    return min(MAX_POST_INTERVAL_SECONDS, max(DEFAULT_POST_INTERVAL_SECONDS, needed))


class Aggregator:
    """Thread-safe: the progress server records from its thread, the reconciler reads from others."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        write_interval: float = WRITE_INTERVAL_SECONDS,
        rate_window: float = RATE_WINDOW_SECONDS,
        post_budget_per_second: float = POST_BUDGET_PER_SECOND,
        wall_clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._clock = clock
        self._wall = wall_clock
        self.write_interval = write_interval
        self.rate_window = rate_window
        self.post_budget_per_second = post_budget_per_second
        self._jobs: dict[JobKey, _Job] = {}
        self._lock = threading.Lock()
        self._interval: tuple[float, float] | None = None  # (computed at, value)

    # -- writes ------------------------------------------------------------------------------

    def record(self, job: JobKey, report: ProgressReport, now: float | None = None, posted: bool = True) -> bool:
        """Apply one pod's report; False when it was stale (an older attempt, a retired pod).
        `posted`: it came as a post the endpoint accepted (not from a termination message)."""
        now = self._clock() if now is None else now
        posted_at = self._wall() if posted else None
        interval = self._interval  # read once, without the lock (suggested_interval takes it)
        allowed_gap = BREAK_INTERVALS * (interval[1] if interval else DEFAULT_POST_INTERVAL_SECONDS) + \
            BREAK_SLACK_SECONDS
        with self._lock:
            state = self._jobs.get(job)
            if state is None:
                state = self._jobs[job] = _Job(first_seen=now)
            if posted_at is not None:  # stale or not, it reached us: the endpoint is reachable
                if state.last_post is not None and (posted_at - state.last_post).total_seconds() > allowed_gap:
                    state.reachable_since = posted_at
                state.last_post, state.refused_since = posted_at, None
            slot = state.slots.get(report.index)
            if slot is None:
                # The first word from this index. It may come after an operator restart with
                # hundreds of images in it: none of them counts toward the rate.
                state.slots[report.index] = _Slot(report, now, posted_at)
                state.dirty = True
                state.changes += 1
                return True
            old = slot.report
            if report.attempt < old.attempt or report.pod in slot.retired:
                return False
            before = (slot.done, old.failed, old.total, old.final)
            if report.attempt > old.attempt or report.pod != old.pod:
                slot.floor = slot.done
                slot.retired.add(old.pod)
                slot.report = report
                rendered = report.completed  # all since the index's previous pod
            else:
                slot.report = _merge(old, report)
                rendered = slot.report.completed - old.completed
                _note_gap(state, old, slot.report)
            slot.received = now
            slot.posted_at = posted_at or slot.posted_at
            slot._view = None
            if rendered > 0:
                self._add_rendered(state, rendered, now)
            if (slot.done, slot.report.failed, slot.report.total, slot.report.final) != before:
                state.dirty = True
                state.changes += 1
            return True

    def refused(self, job: JobKey, status: int, reason: str) -> bool:
        """The endpoint refused a post for this job, or could not check it: the job's last error.
        Only for a job the reconciler has seen (`set_total`): a caller can name any job. True when
        the error differs from the last one (status would say something new)."""
        at = self._wall()
        reason = reason[:MAX_ERROR_CHARS]
        with self._lock:
            state = self._jobs.get(job)
            if state is None:
                return False
            last = state.last_error
            state.last_error = PostError(at, status, reason)
            if state.refused_since is None:
                state.refused_since = at
            return last is None or (last.status, last.reason) != (status, reason)

    def set_total(self, job: JobKey, total: int | None) -> None:
        """The job's item count when the operator knows it (otherwise the pods' totals are summed)."""
        with self._lock:
            state = self._jobs.get(job)
            if state is None:
                state = self._jobs[job] = _Job(first_seen=self._clock())
            if state.known_total != total:
                state.known_total = total
                state.dirty = True
                state.changes += 1

    def forget(self, job: JobKey) -> None:
        with self._lock:
            self._jobs.pop(job, None)

    def changes(self, job: JobKey) -> int:
        """How many times this job's counts have changed: read before a snapshot, handed to `written`."""
        with self._lock:
            state = self._jobs.get(job)
            return state.changes if state is not None else 0

    def written(self, job: JobKey, seen: int | None = None, now: float | None = None) -> None:
        """The caller wrote this job's progress in a status write of its own (a reconcile that
        had other reasons to write): the throttle counts it like one `due` granted. `seen`: the
        `changes` read before the snapshot that was written; a change since stays due."""
        now = self._clock() if now is None else now
        with self._lock:
            state = self._jobs.get(job)
            if state is not None:
                if seen is None or seen == state.changes:
                    state.dirty = False
                state.last_write = now

    def mark_dirty(self, job: JobKey) -> None:
        """A status write failed: make the job due again (still throttled)."""
        with self._lock:
            if job in self._jobs:
                self._jobs[job].dirty = True

    # -- reads -------------------------------------------------------------------------------

    def jobs(self) -> list[JobKey]:
        with self._lock:
            return list(self._jobs)

    def due(self, job: JobKey, now: float | None = None) -> bool:
        """True at most once per write interval, and only when the counts changed since the last
        True: the caller then writes status. Step times alone do not make a job due: they serve
        stall detection, which reads them from here, not from status."""
        now = self._clock() if now is None else now
        with self._lock:
            state = self._jobs.get(job)
            if state is None or not state.dirty:
                return False
            if state.last_write is not None and now - state.last_write < self.write_interval:
                return False
            state.dirty = False
            state.last_write = now
            return True

    def next_due(self, job: JobKey, now: float | None = None) -> float | None:
        """Seconds until `due` can say True (0: now); None when nothing changed. For scheduling a wake-up."""
        now = self._clock() if now is None else now
        with self._lock:
            state = self._jobs.get(job)
            if state is None or not state.dirty:
                return None
            if state.last_write is None:
                return 0.0
            return max(0.0, state.last_write + self.write_interval - now)

    def snapshot(self, job: JobKey, now: float | None = None) -> JobProgress | None:
        now = self._clock() if now is None else now
        with self._lock:
            state = self._jobs.get(job)
            if state is None:
                return None
            done, failed, total = state.counts()
            rate = self._rate(state, now)
            remaining = max(0, total - done - failed)
            if not total:
                eta = None
            elif remaining == 0:
                eta = 0
            else:
                eta = math.ceil(remaining / rate) if rate else None
            return JobProgress(
                completed=done,
                failed=failed,
                total=total,
                kept=sum(s.report.skipped for s in state.slots.values()),
                rerendered=sum(s.report.rerendered for s in state.slots.values()),
                percent=min(100.0, round(100.0 * (done + failed) / total, 1)) if total else None,
                images_per_second=None if rate is None else round(rate, 3),
                estimated_seconds_remaining=eta,
                ranks=sum(s.report.ranks for s in state.slots.values()),
                indexes={i: s.view() for i, s in state.slots.items()},
                slowest_gap_seconds=state.slowest_gap,
                last_post=state.last_post,
                reachable_since=state.reachable_since,
                last_error=state.last_error,
                refused_since=state.refused_since,
            )

    def take(self, job: JobKey, now: float | None = None) -> JobProgress | None:
        """`due` and `snapshot` in one: the progress to write now, or None."""
        now = self._clock() if now is None else now
        return self.snapshot(job, now) if self.due(job, now) else None

    def suggested_interval(self, now: float | None = None) -> float:
        """The post interval for every pod of this replica (backpressure), recomputed once a second:
        counting the pods on every post would cost more than the post."""
        now = self._clock() if now is None else now
        with self._lock:
            if self._interval is not None and now - self._interval[0] < 1.0:
                return self._interval[1]
            recent = now - 2 * MAX_POST_INTERVAL_SECONDS
            active = sum(
                1
                for state in self._jobs.values()
                for slot in state.slots.values()
                if not slot.report.final and slot.received >= recent
            )
            value = post_interval(active, self.post_budget_per_second)
            self._interval = (now, value)
            return value

    # -- the rate ----------------------------------------------------------------------------

    def _add_rendered(self, state: _Job, count: int, now: float) -> None:
        state.rendered += count
        if state.samples and now - state.samples[-1][0] < _SAMPLE_RESOLUTION:
            state.samples[-1] = (state.samples[-1][0], state.rendered)
        else:
            state.samples.append((now, state.rendered))
        # Keep one sample at or before the window's start: the baseline the increase counts from.
        start = now - self.rate_window
        while len(state.samples) > 1 and state.samples[1][0] <= start:
            state.samples.popleft()

    def _rate(self, state: _Job, now: float) -> float | None:
        """Images rendered over the last window (or since the job was first seen), per second."""
        begin = max(now - self.rate_window, state.first_seen)
        span = now - begin
        if span < _SAMPLE_RESOLUTION:
            return None  # a count over a sliver of time would be noise
        baseline = 0
        for t, value in state.samples:
            if t > begin:
                break
            baseline = value
        return (state.rendered - baseline) / span
