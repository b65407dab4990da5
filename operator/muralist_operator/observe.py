"""Summaries of the children the operator watches: plain data, built from API objects.

The kopf indexes store these instead of whole objects (less memory with hundreds of jobs),
and `lifecycle.decide` reads only these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from muralist_runtime.spec import contract
from muralist_runtime.spec.contract import COMPLETION_INDEX_ANNOTATION

from muralist_operator.render import LABEL_ATTEMPT, LABEL_JOB


@dataclass(frozen=True)
class JobView:
    attempt: int
    deleting: bool
    suspended: bool
    complete: bool
    failed: bool
    failure_reason: str
    failure_message: str
    ready: int
    start_time: str | None


@dataclass(frozen=True)
class Termination:
    """A container that ended with a non-zero code: its code, reason and message."""

    exit_code: int
    reason: str
    message: str

    @property
    def permanent(self) -> bool:
        return contract.is_permanent(self.exit_code, self.message)

    @property
    def summary(self) -> str:
        report = contract.Termination.parse(self.message)
        if report is not None and report.message:
            return report.message
        text = self.message.strip().splitlines()
        return text[-1][:500] if text else f"exit code {self.exit_code} ({self.reason})"


@dataclass(frozen=True)
class PodView:
    attempt: int
    index: int
    phase: str
    deleting: bool
    termination: Termination | None


@dataclass(frozen=True)
class RankReport:
    attempt: int
    completed: int
    skipped: int
    failed: int
    total: int
    # The last sign of *progress* (a denoising step or an image written), not mere liveness:
    # a rank stuck in a collective keeps its reporter thread alive but stops stepping.
    progress_time: str | None


@dataclass
class Observed:
    job: JobView | None = None
    pods: list[PodView] = field(default_factory=list)
    ranks: dict[str, RankReport] = field(default_factory=dict)


def _attempt(labels: dict[str, str]) -> int:
    try:
        return int(labels.get(LABEL_ATTEMPT, "0"))
    except ValueError:
        return 0


def job_view(body: dict[str, Any]) -> JobView:
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    failed = conditions.get("Failed") or {}
    return JobView(
        attempt=_attempt(meta.get("labels") or {}),
        deleting=bool(meta.get("deletionTimestamp")),
        suspended=bool(spec.get("suspend")),
        complete="Complete" in conditions,
        failed="Failed" in conditions,
        failure_reason=failed.get("reason", ""),
        failure_message=failed.get("message", ""),
        ready=int(status.get("ready") or 0),
        start_time=status.get("startTime"),
    )


def pod_view(body: dict[str, Any]) -> PodView:
    meta, status = body.get("metadata", {}), body.get("status") or {}
    termination = None
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode", 0) != 0:
            termination = Termination(
                exit_code=int(term.get("exitCode", 1)),
                reason=term.get("reason", ""),
                message=term.get("message", "") or "",
            )
    annotations = meta.get("annotations") or {}
    try:
        index = int(annotations.get(COMPLETION_INDEX_ANNOTATION, "-1"))
    except ValueError:
        index = -1
    return PodView(
        attempt=_attempt(meta.get("labels") or {}),
        index=index,
        phase=status.get("phase", "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        termination=termination,
    )


def rank_reports(data: dict[str, str] | None) -> dict[str, RankReport]:
    """The progress ConfigMap's `rank-<r>` entries; malformed ones are ignored."""
    out: dict[str, RankReport] = {}
    for key, raw in (data or {}).items():
        try:
            value = json.loads(raw)
            out[key] = RankReport(
                attempt=int(value.get("attempt", 0)),
                completed=int(value.get("completed", 0)),
                skipped=int(value.get("skipped", 0)),
                failed=int(value.get("failed", 0)),
                total=int(value.get("total", 0)),
                progress_time=max(filter(None, (value.get("lastStepTime"), value.get("lastImageTime"))), default=None),
            )
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def owner_of(body: dict[str, Any]) -> str | None:
    return ((body.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB)
