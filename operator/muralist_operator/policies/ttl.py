"""runPolicy.ttlSecondsAfterFinished: a finished DiffusionJob deletes itself after a while."""

from __future__ import annotations

from datetime import datetime

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
