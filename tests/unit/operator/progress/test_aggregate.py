"""The progress aggregator: per-index reports to job totals, rate, ETA and the write throttle."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from muralist_api.contract.progress import ProgressReport, ReportError
from muralist_operator.progress.aggregate import Aggregator, post_interval

from tests.unit.operator.clock import T0, Clock

JOB = ("ns", "cats")


def report(index: int = 0, attempt: int = 0, pod: str | None = None, completed: int = 0, skipped: int = 0,
           failed: int = 0, total: int = 10, step: int | None = None, final: bool = False,
           done: bool = False) -> ProgressReport:
    """`step`: seconds after T0 of the last denoising step."""
    return ProgressReport(
        pod=pod or f"cats-{attempt}-{index}", index=index, attempt=attempt, ranks=8, completed=completed,
        skipped=skipped, failed=failed, total=total,
        last_step_time=None if step is None else T0 + timedelta(seconds=step), last_image_time=None,
        sent_at=T0, final=final, finished=done,
    )


# -- counts: (reports in order, expected (completed, failed, total), expected applied flags) --------

COUNT_CASES: dict[str, tuple[list[ProgressReport], tuple[int, int, int], list[bool]]] = {
    "cumulative posts of one pod": (
        [report(completed=2), report(completed=5)], (5, 0, 10), [True, True]),
    "skipped images count as completed": (
        [report(completed=2, skipped=3)], (5, 0, 10), [True]),
    "a late post of the same pod cannot lower a count": (
        [report(completed=5, failed=1), report(completed=3)], (5, 1, 10), [True, True]),
    "indexes add up; the total is the job's, the same from every pod (the largest is taken)": (
        [report(index=0, completed=3), report(index=1, completed=4, failed=1, total=12)], (7, 1, 12), [True, True]),
    "a newer attempt replaces counts but keeps what was done": (
        [report(completed=6, failed=1), report(attempt=1, completed=0, skipped=2)], (6, 0, 10), [True, True]),
    "the newer attempt counts once it passes the old one": (
        [report(completed=6), report(attempt=1, completed=0, skipped=2), report(attempt=1, completed=2, skipped=6)],
        (8, 0, 10), [True, True, True]),
    "a post of an older attempt is ignored": (
        [report(attempt=1, completed=1), report(attempt=0, completed=9)], (1, 0, 10), [True, False]),
    "a new pod of the same index takes over; the retired pod's late post is ignored": (
        [report(pod="a", completed=4), report(pod="b", completed=1), report(pod="a", completed=7)],
        (4, 0, 10), [True, True, False]),
}


@pytest.mark.parametrize("reports, expected, applied", COUNT_CASES.values(), ids=COUNT_CASES.keys())
def test_counts(reports: list[ProgressReport], expected: tuple[int, int, int], applied: list[bool]) -> None:
    agg = Aggregator(clock=Clock())
    assert [agg.record(JOB, r) for r in reports] == applied
    snap = agg.snapshot(JOB)
    assert snap is not None
    assert (snap.completed, snap.failed, snap.total) == expected


def test_known_total_wins_over_the_pods_totals() -> None:
    agg = Aggregator(clock=Clock())
    agg.record(JOB, report(completed=3, total=10))
    agg.set_total(JOB, 40)
    snap = agg.snapshot(JOB)
    assert snap is not None and (snap.total, snap.percent, snap.status_fields()["summary"]) == (40, 7.5, "3/40")


def test_unknown_job_has_no_snapshot_and_is_never_due() -> None:
    agg = Aggregator(clock=Clock())
    assert agg.snapshot(JOB) is None
    assert not agg.due(JOB)
    assert agg.next_due(JOB) is None


# -- rate and ETA: (posts as (seconds after start, completed, skipped), query time) -> images/s ----

RATE_CASES: dict[str, tuple[list[tuple[float, int, int]], float, float | None]] = {
    "under a second of history: no rate": ([(0, 0, 0)], 0.5, None),
    "nothing rendered: zero": ([(0, 0, 0), (10, 0, 0)], 20, 0.0),
    "steady 2/s over two windows": ([(t, 2 * t, 0) for t in range(0, 121, 3)], 120, 2.0),
    "stopped for the last 30 s of the window: half": ([(t, 2 * t, 0) for t in range(0, 91, 3)], 120, 1.0),
    "counts from before we watched (operator restart) do not count": ([(0, 500, 0), (10, 510, 0)], 10, 1.0),
    "skipped images are not renders": ([(0, 0, 0), (10, 0, 50)], 10, 0.0),
}


@pytest.mark.parametrize("posts, at, expected", RATE_CASES.values(), ids=RATE_CASES.keys())
def test_images_per_second(posts: list[tuple[float, int, int]], at: float, expected: float | None) -> None:
    clock = Clock()
    start = clock.now
    agg = Aggregator(clock=clock, rate_window=60)
    for t, completed, skipped in posts:
        clock.now = start + t
        agg.record(JOB, report(completed=completed, skipped=skipped, total=10_000))
    clock.now = start + at
    snap = agg.snapshot(JOB)
    assert snap is not None
    if expected is None:
        assert snap.images_per_second is None
    else:
        assert snap.images_per_second == pytest.approx(expected, abs=0.05)


def test_rate_sums_all_pods_and_counts_a_replacement_pods_renders() -> None:
    clock = Clock()
    agg = Aggregator(clock=clock)
    start = clock.now
    agg.record(JOB, report(index=0, completed=0))
    agg.record(JOB, report(index=1, completed=0))
    clock.now = start + 10
    agg.record(JOB, report(index=0, completed=10))
    agg.record(JOB, report(index=1, attempt=1, completed=5, skipped=3))  # a new pod rendered 5 since
    snap = agg.snapshot(JOB)
    assert snap is not None and snap.images_per_second == pytest.approx(1.5)


# (total, completed at the first post, completed a minute later, failed) -> seconds remaining
ETA_CASES: dict[str, tuple[tuple[int, int, int, int], int | None]] = {
    "remaining over rate": ((100, 0, 40, 0), 90),
    "rounded up": ((100, 0, 45, 0), 74),
    "failed items are not remaining": ((100, 0, 40, 20), 60),
    "nothing remaining": ((100, 0, 90, 10), 0),
    "nothing rendered while watched: unknown": ((100, 10, 10, 0), None),
}


@pytest.mark.parametrize("counts, expected", ETA_CASES.values(), ids=ETA_CASES.keys())
def test_estimated_seconds_remaining(counts: tuple[int, int, int, int], expected: int | None) -> None:
    total, first, later, failed = counts
    clock = Clock()
    agg = Aggregator(clock=clock, rate_window=60)
    agg.record(JOB, report(completed=first, total=total))
    clock.now += 60
    agg.record(JOB, report(completed=later, failed=failed, total=total))
    snap = agg.snapshot(JOB)
    assert snap is not None
    assert snap.estimated_seconds_remaining == expected
    assert snap.percent == round(100 * (later + failed) / total, 1)


def test_eta_and_percent_are_unknown_without_a_total() -> None:
    agg = Aggregator(clock=Clock())
    agg.record(JOB, report(completed=3, total=0))
    snap = agg.snapshot(JOB)
    assert snap is not None and (snap.percent, snap.estimated_seconds_remaining) == (None, None)


# -- the write throttle --------------------------------------------------------------------------


def test_due_at_most_once_per_interval_and_only_after_a_change() -> None:
    clock = Clock()
    agg = Aggregator(clock=clock, write_interval=1.0)
    agg.record(JOB, report(completed=1))
    steps: list[tuple[str, bool]] = []
    steps.append(("first report", agg.due(JOB)))
    steps.append(("asked again at once", agg.due(JOB)))
    agg.record(JOB, report(completed=2))
    clock.now += 0.5
    steps.append(("changed, half an interval later", agg.due(JOB)))
    clock.now += 0.5
    steps.append(("changed, a full interval later", agg.due(JOB)))
    clock.now += 5
    steps.append(("nothing changed since", agg.due(JOB)))
    agg.record(JOB, report(completed=2, step=30))
    steps.append(("only a step time changed", agg.due(JOB)))
    agg.record(JOB, report(completed=2, final=True))
    steps.append(("the final post", agg.due(JOB)))
    assert steps == [
        ("first report", True),
        ("asked again at once", False),
        ("changed, half an interval later", False),
        ("changed, a full interval later", True),
        ("nothing changed since", False),
        ("only a step time changed", False),
        ("the final post", True),
    ]


def test_next_due_tells_when_to_wake_and_mark_dirty_retries_a_failed_write() -> None:
    clock = Clock()
    agg = Aggregator(clock=clock, write_interval=1.0)
    agg.record(JOB, report(completed=1))
    assert agg.next_due(JOB) == 0.0
    assert agg.take(JOB) is not None
    assert agg.next_due(JOB) is None
    clock.now += 0.25
    agg.mark_dirty(JOB)  # the status write failed
    assert agg.next_due(JOB) == pytest.approx(0.75)
    assert agg.take(JOB) is None
    clock.now += 0.75
    snap = agg.take(JOB)
    assert snap is not None and snap.completed == 1


def test_jobs_are_throttled_independently_and_forgotten() -> None:
    agg = Aggregator(clock=Clock())
    other = ("ns", "dogs")
    agg.record(JOB, report())
    agg.record(other, report())
    assert (agg.due(JOB), agg.due(other)) == (True, True)
    agg.forget(JOB)
    assert agg.jobs() == [other]


# -- stall detection and backpressure ------------------------------------------------------------


def test_oldest_progress_time_skips_finished_indexes() -> None:
    agg = Aggregator(clock=Clock())
    agg.record(JOB, report(index=0, completed=10, total=40, step=5, done=True))  # done: its silence is expected
    agg.record(JOB, report(index=1, completed=3, step=20))
    agg.record(JOB, report(index=2, completed=3, step=40))
    agg.record(JOB, report(index=3, completed=1))  # not stepped yet: loading has its own guards
    snap = agg.snapshot(JOB)
    assert snap is not None
    assert snap.oldest_progress_time == T0 + timedelta(seconds=20)
    assert snap.indexes[0].finished and not snap.indexes[1].finished
    assert snap.ranks == 32


def test_the_slowest_gap_is_the_longest_a_working_pod_went_between_signs_of_progress() -> None:
    agg = Aggregator(clock=Clock())
    agg.record(JOB, report(index=0, completed=0))  # loading: no gap yet
    assert agg.snapshot(JOB).slowest_gap_seconds is None  # type: ignore[union-attr]
    for step in (5, 8, 30, 33):  # 22 s between the 8th and the 30th second (a VAE decode, say)
        agg.record(JOB, report(index=0, completed=1, step=step))
    agg.record(JOB, report(index=1, completed=1, step=3))
    agg.record(JOB, report(index=1, completed=1, step=13))
    # A retried pod's first step after the old pod's last is a reload, not a gap; and a pod
    # that said it is done may be quiet as long as it likes.
    agg.record(JOB, report(index=1, attempt=1, pod="cats-1-1b", completed=1, step=400))
    agg.record(JOB, report(index=2, completed=1, step=40, done=True))
    agg.record(JOB, report(index=2, completed=1, step=500, done=True))
    assert agg.snapshot(JOB).slowest_gap_seconds == 22.0  # type: ignore[union-attr]


def test_an_index_view_follows_every_post_and_stale_posts_leave_it() -> None:
    # Views are kept between snapshots; each accepted post must show in the next one.
    clock = Clock()
    agg = Aggregator(clock=clock, wall_clock=lambda: T0 + timedelta(seconds=clock.now - 1000))
    agg.record(JOB, report(index=0, completed=1, step=5))
    agg.record(JOB, report(index=1, completed=1, step=5))
    first = agg.snapshot(JOB)
    clock.now += 4
    agg.record(JOB, report(index=0, completed=3, step=9))
    agg.record(JOB, report(index=1, attempt=1, pod="cats-1-1b", completed=0, step=9))  # a retried pod
    second = agg.snapshot(JOB)
    assert first is not None and second is not None
    assert (first.indexes[0].done, first.indexes[0].posted_at) == (1, T0)
    assert (second.indexes[0].done, second.indexes[0].posted_at) == (3, T0 + timedelta(seconds=4))
    assert second.indexes[0].progress_time == T0 + timedelta(seconds=9)
    assert (second.indexes[1].pod, second.indexes[1].attempt, second.indexes[1].done) == ("cats-1-1b", 1, 1)
    clock.now += 4
    assert not agg.record(JOB, report(index=1, attempt=0, completed=9))  # stale: nothing changes
    assert agg.snapshot(JOB).indexes[1] == second.indexes[1]  # type: ignore[union-attr]


def test_counts_alone_never_say_an_index_is_finished() -> None:
    # `total` is the job's: a pod with as many images as the whole job's total is not
    # thereby done (another index may have claimed none), only its `done` or `final` says so.
    agg = Aggregator(clock=Clock())
    agg.record(JOB, report(index=0, completed=10, total=10, step=5))
    agg.record(JOB, report(index=1, completed=0, total=10, step=5, final=True))
    snap = agg.snapshot(JOB)
    assert snap is not None and not snap.indexes[0].finished and snap.indexes[1].finished


def test_a_status_write_of_a_reconcile_counts_for_the_throttle() -> None:
    clock = Clock()
    agg = Aggregator(clock=clock, write_interval=1.0)
    agg.record(JOB, report(completed=1))
    agg.written(JOB)
    assert agg.next_due(JOB) is None and not agg.due(JOB)
    agg.record(JOB, report(completed=2))
    assert agg.next_due(JOB) == 1.0 and not agg.due(JOB)
    clock.now += 1.0
    assert agg.due(JOB)


@pytest.mark.parametrize(
    "pods, budget, expected",
    [(1, 200, 3), (600, 200, 3), (601, 200, 3.5), (700, 200, 3.5), (701, 200, 4), (1024, 200, 5.5),
     (1024, 400, 3), (100_000, 200, 30), (10, 0, 30)],
)
def test_post_interval(pods: int, budget: float, expected: float) -> None:
    assert post_interval(pods, budget) == expected


def test_default_budget_has_1024_pods_post_every_3_and_a_half_seconds() -> None:
    # 4 s plus the 1 s write interval would be the whole 5 s lag target (benchmarks/progress_load.py).
    assert post_interval(1024) == 3.5


def test_suggested_interval_counts_pods_still_posting() -> None:
    clock = Clock()
    agg = Aggregator(clock=clock, post_budget_per_second=10)
    for i in range(40):
        agg.record(JOB, report(index=i))
    for i in range(40, 50):
        agg.record(JOB, report(index=i, final=True))
    assert agg.suggested_interval() == 4
    clock.now += 61  # nobody posted for a minute: nothing to hold back
    assert agg.suggested_interval() == 3


# -- the wire body -------------------------------------------------------------------------------


def body(**changes: Any) -> bytes:
    doc: dict[str, Any] = {"pod": "cats-0-x", "index": 0, "attempt": 0, "ranks": 8, "completed": 3, "skipped": 1,
                           "failed": 0, "total": 10, "lastStepTime": "2026-12-01T12:00:00Z", "lastImageTime": None,
                           "sentAt": "2026-12-01T12:00:01+00:00", "final": False}
    doc.update(changes)
    return json.dumps({k: v for k, v in doc.items() if v != "<absent>"}).encode()


def test_parse_report_reads_the_contract() -> None:
    r = ProgressReport.from_wire(body(future="ignored"))
    assert (r.pod, r.index, r.ranks, r.items_done, r.total, r.final) == ("cats-0-x", 0, 8, 4, 10, False)
    assert r.progress_time == T0 and r.sent_at == T0 + timedelta(seconds=1)
    assert r.finished is False  # `done` is optional (older runtimes)
    assert ProgressReport.from_wire(body(done=True)).finished is True


@pytest.mark.parametrize(
    "changes, error",
    [
        ({"completed": "3"}, "completed must be an integer"),
        ({"failed": True}, "failed must be an integer"),
        ({"skipped": -1}, "skipped must be >= 0"),
        ({"ranks": 0}, "ranks must be >= 1"),
        ({"total": "<absent>", "sentAt": "<absent>"}, "missing field(s): total, sentAt"),
        ({"pod": ""}, "pod must be a pod name"),
        ({"final": 1}, "final must be true or false"),
        ({"done": "yes"}, "done must be true or false"),
        ({"lastStepTime": "yesterday"}, "lastStepTime is not an RFC 3339 time"),
        ({"sentAt": "2026-12-01T12:00:00"}, "sentAt needs a time zone"),
        ({"sentAt": None}, "sentAt must be an RFC 3339 time"),
    ],
)
def test_parse_report_names_the_bad_field(changes: dict[str, Any], error: str) -> None:
    with pytest.raises(ReportError) as e:
        ProgressReport.from_wire(body(**changes))
    assert error in str(e.value)


def test_parse_report_refuses_a_non_object() -> None:
    with pytest.raises(ReportError, match="must be a JSON object, not list"):
        ProgressReport.from_wire(b"[1, 2]")


def test_a_report_that_lands_while_an_older_snapshot_is_written_stays_due() -> None:
    # The reconcile reads `changes`, snapshots, decides and writes; a pod's final report lands in
    # between. Clearing `dirty` for it would lose the final counts: no pod posts again.
    clock = Clock()
    agg = Aggregator(clock=clock, write_interval=1.0)
    agg.record(JOB, report(completed=1))
    seen = agg.changes(JOB)
    snap = agg.snapshot(JOB)
    agg.record(JOB, report(completed=6, final=True))
    agg.written(JOB, seen)
    assert snap is not None and snap.completed == 1
    assert agg.next_due(JOB) == 1.0  # still due, after the throttle
    clock.now += 1.0
    assert agg.due(JOB)
    # With nothing in between, the write clears it.
    agg.record(JOB, report(completed=7))
    agg.written(JOB, agg.changes(JOB))
    assert agg.next_due(JOB) is None


def test_when_posts_last_arrived_and_what_the_endpoint_refused() -> None:
    # What stall detection tells silence of the endpoint from a stalled pod by.
    clock = Clock()
    agg = Aggregator(clock=clock, wall_clock=lambda: T0 + timedelta(seconds=clock.now - 1000))
    assert not agg.refused(JOB, 401, "token refused")  # a job never seen (anyone can name any job): nothing kept
    assert agg.snapshot(JOB) is None
    agg.set_total(JOB, 10)
    seen = agg.snapshot(JOB)
    assert seen is not None and (seen.last_post, seen.last_error, seen.refused_since) == (None, None, None)
    clock.now += 5
    assert agg.refused(JOB, 503, "TokenReview failed: the API server did not answer (MaxRetryError)")
    clock.now += 5
    assert agg.refused(JOB, 401, "token refused: invalid bearer token" + "x" * 1000)
    assert not agg.refused(JOB, 401, "token refused: invalid bearer token" + "x" * 1000), "nothing new to say"
    refused = agg.snapshot(JOB)
    assert refused is not None and refused.last_error is not None
    assert (refused.last_error.at, refused.last_error.status) == (T0 + timedelta(seconds=10), 401)
    assert len(refused.last_error.reason) == 300 and refused.refused_since == T0 + timedelta(seconds=5)
    clock.now += 5
    agg.record(JOB, report(index=0, completed=1, step=5))
    # A finished pod's termination message is no post: it says nothing of the endpoint.
    agg.record(JOB, report(index=1, completed=2, final=True), posted=False)
    clock.now += 5
    posted = agg.snapshot(JOB)
    assert posted is not None and (posted.last_post, posted.refused_since) == (T0 + timedelta(seconds=15), None)
    assert posted.last_error == refused.last_error  # kept: the last one the endpoint saw
    assert (posted.indexes[0].posted_at, posted.indexes[1].posted_at) == (T0 + timedelta(seconds=15), None)


def test_a_break_in_a_jobs_posts_restarts_reachable_since() -> None:
    clock = Clock()
    agg = Aggregator(clock=clock, wall_clock=lambda: T0 + timedelta(seconds=clock.now - 1000))
    for _ in range(5):  # a post every 3 s (the default interval): no break
        agg.record(JOB, report(index=0, completed=1, step=5))
        clock.now += 3
    first = agg.snapshot(JOB)
    assert first is not None and first.reachable_since is None, "no break since the first post"
    clock.now += 20  # nothing for 8 + 3 s and more: more than 2 intervals and the slack
    agg.record(JOB, report(index=0, completed=2, step=30))
    resumed = agg.snapshot(JOB)
    assert resumed is not None and resumed.reachable_since == T0 + timedelta(seconds=35) == resumed.last_post
