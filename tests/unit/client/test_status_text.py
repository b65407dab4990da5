"""A status for people: `muralist status`'s lines and the progress bar's counts and suffix."""

from __future__ import annotations

from muralist.status_text import BarState, bar_state, describe, progress_line
from muralist_api.status import DiffusionJobStatus, IndexStatus, Progress

RUNNING = DiffusionJobStatus(
    phase="Running",
    progress=Progress(total=500, completed=117, failed=3, percent=24.0, images_per_second=2.314,
                      estimated_seconds_remaining=164, eta="2m44s"),
    restarts=1,
    indexes=[IndexStatus(index=2, failures=1, last_failure_reason="PodFailed", last_failure="exit 1: NCCL timeout")],
    output_path="cats",
)


def test_describe_names_phase_progress_eta_and_failures() -> None:
    assert describe("cats", RUNNING).splitlines() == [
        "cats: Running",
        "  progress: 117/500 images (24.0%), 3 failed",
        "  rate:     2.31 img/s, ETA 2m44s, 3 failed",
        "  failed items: 3",
        "  failed indexes: 2 (1 pod retry)",
        "    index 2: 1 x PodFailed: exit 1: NCCL timeout",
        "  output: cats",
    ]


def test_describe_a_job_not_started() -> None:
    assert describe("cats", DiffusionJobStatus()).splitlines() == [
        "cats: Pending",
        "  progress: 0 images, total not known yet",
        "  failed items: 0",
    ]


def test_the_bar_counts_failed_items_as_done_and_waits_for_a_total() -> None:
    assert bar_state(RUNNING.progress) == BarState(120, 500, "2.31 img/s, ETA 2m44s, 3 failed")
    assert bar_state(Progress(completed=4)) == BarState(4, None, "no rate yet")
    finished = Progress(total=2, completed=2, eta="0s", estimated_seconds_remaining=0)
    assert bar_state(finished) == BarState(2, 2, "no rate yet")
    assert bar_state(Progress(total=4, completed=2, failed=1)).suffix == "1 failed"


def test_progress_line_without_the_operators_percent() -> None:
    assert progress_line(Progress(total=8, completed=2)) == "2/8 images (25.0%)"
