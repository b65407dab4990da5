"""Summaries of the children the operator watches: plain data, built from API objects.

The kopf indexes store these instead of whole objects (less memory with hundreds of jobs),
and `lifecycle.decide` reads only these, plus the job's progress as the pods pushed it
(progress.aggregate.JobProgress).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from muralist_api import contract
from muralist_api.contract import COMPLETION_INDEX_ANNOTATION, INDEX_FAILURE_COUNT_ANNOTATION

from muralist_operator.naming import LABEL_JOB
from muralist_operator.pod import DISRUPTION_TARGET
from muralist_operator.progress.aggregate import JobProgress

# Set by the operator on a pod it deletes ("Reason: why"): it made no progress, or a pod of its
# world failed; so that the index's failure says why (the pod itself only shows exit code 137).
STOPPED_ANNOTATION = "muralist.dev/stopped"


@dataclass(frozen=True)
class JobView:
    deleting: bool
    suspended: bool
    complete: bool
    failed: bool
    failure_reason: str
    failure_message: str
    ready: int
    start_time: str | None
    failed_indexes: str = ""  # status.failedIndexes: indexes out of retries ("1,3-5")
    # Its size: an elastic Indexed Job changes completions and parallelism together (a resize).
    completions: int | None = None  # None: not said (the API server always fills it in)


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
    index: int
    phase: str
    deleting: bool
    termination: Termination | None
    name: str = ""
    uid: str = ""
    # The Job controller's count of this index's failures before this pod (backoffLimitPerIndex).
    failure_count: int = 0
    # Evicted or preempted (the DisruptionTarget condition): the Job controller does not count it.
    disrupted: bool = False
    stopped: str = ""  # STOPPED_ANNOTATION: "Reason: why"
    created: str | None = None
    finished: str | None = None  # when its container terminated
    # The runtime's final summary (termination message), whatever the exit code: the source of
    # truth for a finished pod's counts, pushed progress or not.
    counts: contract.Counts | None = None
    cache_sample: contract.CacheSample | None = None  # generation.cache.verify, from the termination message
    gated: bool = False  # held back by a scheduling gate (Kueue's, until it admits the size that counts the pod)

    @property
    def stop_reason(self) -> str:
        return self.stopped.partition(":")[0].strip() if self.stopped else ""

    @property
    def stop_note(self) -> str:
        return self.stopped.partition(":")[2].strip() if self.stopped else ""

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def counted_failure(self) -> bool:
        """A failure the Job controller counts against its index's retries."""
        return self.phase == "Failed" and not self.disrupted


@dataclass
class Observed:
    job: JobView | None = None
    pods: list[PodView] = field(default_factory=list)
    progress: JobProgress | None = None
    # The aggregator's count of changes that `progress` reflects (Aggregator.written reads it).
    progress_changes: int | None = None


def job_view(body: Mapping[str, Any]) -> JobView:
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    failed = conditions.get("Failed") or {}
    return JobView(
        deleting=bool(meta.get("deletionTimestamp")),
        suspended=bool(spec.get("suspend")),
        complete="Complete" in conditions,
        failed="Failed" in conditions,
        failure_reason=failed.get("reason", ""),
        failure_message=failed.get("message", ""),
        ready=int(status.get("ready") or 0),
        start_time=status.get("startTime"),
        failed_indexes=status.get("failedIndexes") or "",
        completions=_int(spec["completions"], 1) if spec.get("completions") is not None else None,
    )


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def pod_view(body: Mapping[str, Any]) -> PodView:
    meta, status = body.get("metadata", {}), body.get("status") or {}
    termination, counts, finished, cache_sample = None, None, None, None
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if not term:
            continue
        finished = term.get("finishedAt") or finished
        message = term.get("message", "") or ""
        report = contract.Termination.parse(message) if message else None
        if report is not None:
            counts, cache_sample = report.counts, report.cache_sample
        if term.get("exitCode", 0) != 0:
            termination = Termination(exit_code=int(term.get("exitCode", 1)), reason=term.get("reason", ""),
                                      message=message)
    annotations = meta.get("annotations") or {}
    disrupted = any(c.get("type") == DISRUPTION_TARGET and c.get("status") == "True"
                    for c in status.get("conditions") or [])
    return PodView(
        index=_int(annotations.get(COMPLETION_INDEX_ANNOTATION), -1),
        phase=status.get("phase", "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        termination=termination,
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        failure_count=_int(annotations.get(INDEX_FAILURE_COUNT_ANNOTATION), 0),
        disrupted=disrupted,
        stopped=annotations.get(STOPPED_ANNOTATION, ""),
        created=meta.get("creationTimestamp"),
        finished=finished,
        counts=counts,
        cache_sample=cache_sample,
        gated=bool((body.get("spec") or {}).get("schedulingGates")),
    )


def owner_of(body: Mapping[str, Any]) -> str | None:
    return ((body.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB)
