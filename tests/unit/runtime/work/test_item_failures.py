"""When failed items fail the job (item_failures): the rules as tables, and the store's counters
that feed them across pods (chunks.Tally)."""

from __future__ import annotations

import pytest
from muralist_api.pods import RunPolicy
from muralist_runtime.work import chunks
from muralist_runtime.work.item_failures import (
    FailureVerdict,
    JobTally,
    chunk_verdict,
    describe_item,
    failure,
    merge_verdict,
    systematic,
)

LIMIT = "spec.runPolicy.maxFailedItems"


@pytest.mark.parametrize(("chunks", "completed", "failed", "expected"), [
    (1, 0, 32, False),  # one chunk, however large, is not yet a pattern
    (2, 0, 64, False),
    (3, 0, 10, True),  # the first 3 chunks, 10 items: every one failed
    (3, 0, 9, False),  # 3 chunks of 3 rows: too few items to call it systematic
    (12, 0, 12, True),  # chunks of one item: 12 in a row
    (3, 1, 95, False),  # one item completed: the cause is not shared by all
    (500, 1, 5000, False),  # ... and never becomes systematic later (rule 1's business)
    (0, 0, 0, False),
])
def test_systematic_failure_is_no_item_completed_in_the_first_chunks(chunks: int, completed: int, failed: int,
                                                                     expected: bool) -> None:
    assert systematic(JobTally(chunks, completed, failed)) is expected


@pytest.mark.parametrize(("policy", "total", "tally", "expected"), [
    # The default, 1%: a small job fails on its first failed item, a large one tolerates a few.
    ({}, 40, JobTally(1, 2, 1),
     FailureVerdict(LIMIT, "1 items failed, more than the 0 allowed (1% of 40 items, the default)")),
    ({}, 99, JobTally(4, 50, 1),
     FailureVerdict(LIMIT, "1 items failed, more than the 0 allowed (1% of 99 items, the default)")),
    ({}, 100, JobTally(4, 50, 1), None),
    ({}, 1_000_000, JobTally(900, 20_000, 10_000), None),
    ({}, 1_000_000, JobTally(900, 20_000, 10_001),
     FailureVerdict(LIMIT, "10001 items failed, more than the 10000 allowed (1% of 1000000 items, the default)")),
    ({"maxFailedItems": 0}, 1000, JobTally(1, 31, 1), FailureVerdict(LIMIT, "1 items failed, more than the 0 allowed")),
    ({"maxFailedItems": 5}, 1000, JobTally(9, 200, 5), None),
    ({"maxFailedItems": "2.5%"}, 1000, JobTally(9, 200, 26),
     FailureVerdict(LIMIT, "26 items failed, more than the 25 allowed (2.5% of 1000 items)")),
    ({"maxFailedItems": None}, 40, JobTally(1, 2, 1),  # null is the default, as the API server has it
     FailureVerdict(LIMIT, "1 items failed, more than the 0 allowed (1% of 40 items, the default)")),
    # Systematic, whatever the limit (and named so: raising the limit would not help).
    ({"maxFailedItems": "100%"}, 10_000, JobTally(3, 0, 96),
     FailureVerdict("items", "no item completed: the first 3 chunks (96 items) all failed, a systematic failure "
                    "that the rest would share")),
    ({}, 40, JobTally(4, 0, 12),
     FailureVerdict("items", "no item completed: the first 4 chunks (12 items) all failed, a systematic failure "
                    "that the rest would share")),
    ({"maxFailedItems": "100%"}, 10_000, JobTally(2, 0, 64), None),
    ({"maxFailedItems": "100%"}, 8, JobTally(8, 0, 8), None),  # too small to tell: the merge's rule
])
def test_a_chunk_end_fails_the_job_on_too_many_or_systematic_failures(policy: dict, total: int, tally: JobTally,
                                                                      expected: FailureVerdict | None) -> None:
    assert chunk_verdict(tally, RunPolicy.model_validate(policy), total) == expected


@pytest.mark.parametrize(("completed", "failed", "expected"), [
    (0, 8, FailureVerdict("items", "every item failed (8), none completed")),
    (1, 7, None),
    (8, 0, None),
    (0, 0, None),  # nothing to render (refused before, at the spec's check)
])
def test_a_job_is_never_succeeded_with_every_item_failed(completed: int, failed: int,
                                                          expected: FailureVerdict | None) -> None:
    assert merge_verdict(completed, failed) == expected


def test_the_failure_names_the_first_items_with_their_reasons() -> None:
    lines = [describe_item("00000-000", "sku-0", "column 'text': missing"),
             describe_item("00001-000", None, "the output has NaN\nor infinite values"),
             describe_item("00002-000", "", "x" * 500),
             describe_item("00003-000", None, "not named: three are enough")]
    assert lines[:2] == ["00000-000 (sku-0): column 'text': missing",
                         "00001-000: the output has NaN or infinite values"]
    assert len(lines[2]) < 220 and lines[2].endswith("...")
    e = failure(FailureVerdict("items", "every item failed (4), none completed"), lines)
    assert e.field == "items"
    assert str(e) == (f"items: every item failed (4), none completed; first failed: {lines[0]}; {lines[1]}; "
                      f"{lines[2]}")
    assert str(failure(FailureVerdict("items", "x"), [])).endswith("first failed: -")


def test_no_item_completed_is_read_once_the_chunk_is_counted() -> None:
    """Two pods end chunks at once: pod B's chunk, with completed items, is counted between pod
    A's count of its completed items (none) and of its chunk. A must not call it systematic."""
    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    with ClaimServer(0) as server, ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) as store:
        pod_b = chunks.Tally(store)
        for chunk in range(2):
            pod_b.finished(10 + chunk, 0, 4)

        class Interleaved:
            fired = False

            def add(self, name: str, amount: int) -> int:
                if name == "done" and amount == 1 and not self.fired:
                    self.fired = True
                    pod_b.finished(20, 4, 0)
                return store.add(name, amount)

            def append(self, name: str, text: str) -> None:
                store.append(name, text)

            def compare_set(self, name: str, expected: str, desired: str) -> str:
                return store.compare_set(name, expected, desired)

        seen = chunks.Tally(Interleaved()).finished(0, 0, 4)  # type: ignore[arg-type]
    assert seen == JobTally(chunks=4, completed=4, failed=12)
    assert chunk_verdict(seen, RunPolicy(max_failed_items="100%"), 1000) is None
