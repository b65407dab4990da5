"""runPolicy.stallTimeoutSeconds: a group whose ranks stop making progress is restarted.

The clock of a rank starts at its first step: loading and rendezvous have their own guards
(collectiveTimeoutSeconds, activeDeadlineSeconds) and vary too much with the model and the
node to share one timeout with a denoising step.
"""

from __future__ import annotations

from datetime import datetime

from muralist_runtime.spec.api import RunPolicy

from muralist_operator.decision import parse_time
from muralist_operator.observe import RankReport


def stalled_seconds(policy: RunPolicy, ranks: dict[str, RankReport], attempt: int, now: datetime) -> int | None:
    """Seconds without progress when over the timeout (the quietest rank of this attempt); else None."""
    timeout = policy.stall_timeout_seconds
    if timeout is None:
        return None
    latest: list[datetime] = []
    for report in ranks.values():
        if report.attempt != attempt or not report.progress_time:
            continue
        if report.total and report.completed + report.skipped + report.failed >= report.total:
            continue  # this rank is done: silence is expected
        moment = parse_time(report.progress_time)
        if moment is not None:
            latest.append(moment)
    if not latest:
        return None
    quiet = int((now - min(latest)).total_seconds())
    return quiet if quiet > timeout else None


def message(quiet: int) -> str:
    return f"no progress for {quiet}s (runPolicy.stallTimeoutSeconds)"
