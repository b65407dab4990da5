"""runPolicy.ttlSecondsAfterFinished: a finished DiffusionJob deletes itself after a while."""

from __future__ import annotations

from datetime import datetime, timedelta

from muralist_api.pods import RunPolicy
from muralist_api.status import DiffusionJobStatus

from muralist_operator.decision import parse_time


def expired(status: DiffusionJobStatus, policy: RunPolicy, now: datetime) -> str | None:
    """Why a finished job should go now; None while it stays (or has no TTL)."""
    ttl = policy.ttl_seconds_after_finished
    finished = parse_time(status.completion_time)
    if ttl is None or finished is None or (now - finished).total_seconds() < ttl:
        return None
    return f"ttlSecondsAfterFinished={ttl} passed"


def due(status: DiffusionJobStatus, policy: RunPolicy) -> datetime | None:
    """When a finished job's time to live ends (the clock's wake-up); None without a TTL, or unfinished."""
    ttl, finished = policy.ttl_seconds_after_finished, parse_time(status.completion_time)
    if ttl is None or finished is None:
        return None
    return finished + timedelta(seconds=ttl)
