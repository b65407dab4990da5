"""runPolicy.activeDeadlineSeconds: counted from the first start, across restarts."""

from __future__ import annotations

from datetime import datetime, timedelta

from muralist_api.pods import RunPolicy
from muralist_api.status import DiffusionJobStatus

from muralist_operator.decision import parse_time


def exceeded(status: DiffusionJobStatus, policy: RunPolicy, now: datetime) -> bool:
    deadline, started = policy.active_deadline_seconds, parse_time(status.start_time)
    return deadline is not None and started is not None and (now - started).total_seconds() >= deadline


def due(status: DiffusionJobStatus, policy: RunPolicy) -> datetime | None:
    """When the deadline passes (the clock's wake-up); None without one, or before the first start."""
    deadline, started = policy.active_deadline_seconds, parse_time(status.start_time)
    if deadline is None or started is None:
        return None
    return started + timedelta(seconds=deadline)


def remaining(status: DiffusionJobStatus, policy: RunPolicy, now: datetime) -> int | None:
    """The deadline a new pod group gets: what is left of the job's (at least 1 s)."""
    deadline, started = policy.active_deadline_seconds, parse_time(status.start_time)
    if deadline is None:
        return None
    if started is None:
        return deadline
    return max(1, deadline - int((now - started).total_seconds()))


def message(policy: RunPolicy) -> str:
    return f"did not finish within activeDeadlineSeconds={policy.active_deadline_seconds}"
