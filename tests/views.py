"""Builders for what the operator observes (JobView, PodView), shared by the decision tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from muralist_operator.decision import iso
from muralist_operator.observe import JobView, PodView, Termination

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def job_view(attempt: int = 0, **fields: Any) -> JobView:
    base: dict[str, Any] = dict(attempt=attempt, deleting=False, suspended=False, complete=False, failed=False,
                                failure_reason="", failure_message="", ready=0,
                                start_time=iso(NOW - timedelta(seconds=30)))
    return JobView(**(base | fields))


def pod(index: int = 0, phase: str = "Running", attempt: int = 0, term: Termination | None = None) -> PodView:
    return PodView(attempt=attempt, index=index, phase=phase, deleting=False, termination=term)
