"""What a wait ends in besides success carries what a caller needs to act on it."""

from __future__ import annotations

from muralist import JobFailed, WaitTimeout
from muralist_api.status import DiffusionJobStatus, IndexStatus, Progress


def test_job_failed_carries_the_message_and_the_failed_indexes() -> None:
    status = DiffusionJobStatus(phase="Failed", message="index 1 failed 4 times: out of memory",
                                indexes=[IndexStatus(index=1, failures=4), IndexStatus(index=3, failures=1)])
    error = JobFailed("cats", status)
    assert (error.message, error.failed_indexes, error.status) == (status.message, [1, 3], status)
    assert str(error) == "DiffusionJob cats failed: index 1 failed 4 times: out of memory (failed indexes: 1, 3)"


def test_wait_timeout_is_a_timeout_error_saying_what_it_last_saw() -> None:
    last = DiffusionJobStatus(phase="Running", progress=Progress(total=10, completed=3, failed=1, eta="9s"))
    error = WaitTimeout("cats", 2.5, last)
    assert isinstance(error, TimeoutError) and error.last_status is last
    assert str(error) == "DiffusionJob cats did not finish within 2.5s; last seen: phase Running, 4/10 images, ETA 9s"
