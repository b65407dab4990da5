"""Summaries of the children the operator watches: plain data, built from API objects.

The kopf indexes store these instead of whole objects (less memory with hundreds of jobs),
and `lifecycle.decide` reads only these, plus the job's progress as the pods pushed it
(progress.snapshot.JobProgress). Each summary carries the uid of its controller (the owner
reference with `controller: true`): a child counts only when that is the job's, whatever its
name or labels say (`owned_by`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from muralist_api import contract
from muralist_api.contract import COMPLETION_INDEX_ANNOTATION, INDEX_FAILURE_COUNT_ANNOTATION
from muralist_api.contract.counts import CheckpointSteps

from muralist_operator.naming import LABEL_JOB
from muralist_operator.pod import DISRUPTION_TARGET
from muralist_operator.progress.snapshot import JobProgress

# Set by the operator on a pod it deletes ("Reason: why"): it made no progress, or a pod of its
# world failed; so that the index's failure says why (the pod itself only shows exit code 137).
STOPPED_ANNOTATION = "muralist.dev/stopped"


# Why a container of a pod on its way up waits when nothing is wrong (yet).
STARTING_REASONS = frozenset({"", "ContainerCreating", "PodInitializing"})
# A pod's PodScheduled=False reason that is no verdict of the scheduler's: the pod waits for its gates.
SCHEDULING_GATED = "SchedulingGated"


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
    name: str = ""
    uid: str = ""
    owner_uid: str = ""  # its controller's: the DiffusionJob that created it


@dataclass(frozen=True)
class ContainerExit:
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
    termination: ContainerExit | None
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
    # The whole job's items as the merge found them (the first pod's message, once it merged).
    merged: contract.Counts | None = None
    merged_steps: CheckpointSteps | None = None  # and runPolicy.checkpoint's steps saved and lost
    cache_sample: contract.CacheSample | None = None  # generation.cache.verify, from the termination message
    gated: bool = False  # held back by a scheduling gate (Kueue's, until it admits the size that counts the pod)
    owner_uid: str = ""  # its controller's: the Job that created it
    scheduled: bool = False  # bound to a node
    generation: int = 1  # metadata.generation: past 1 once its spec changed (a scheduling gate lifted)
    # Why it has not started, by its own status (`waiting`): ("", "") while it is merely on its way.
    waiting_reason: str = ""
    waiting_message: str = ""

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


@dataclass(frozen=True)
class IndexFailures:
    """One index as its pods tell it: how often it failed, and its newest pod."""

    index: int
    failures: int
    newest: PodView
    last_failed: PodView | None

    @property
    def retrying(self) -> bool:
        """Its newest pod failed and the Job controller has not started the next one yet, or the
        next one is not running yet."""
        return self.newest.counted_failure or (self.failures > 0 and self.newest.phase == "Pending")


def _newest_first(pod: PodView) -> tuple[int, bool, str, str]:
    # The retry count grows with each counted failure; a pod replacing a disrupted one has the
    # same count and is live, or newer.
    return (pod.failure_count, not pod.terminal, pod.created or "", pod.name)


# Every index's pods summed up (by_index).
ByIndex = dict[int, IndexFailures]


def by_index(pods: list[PodView]) -> ByIndex:
    """Every index's pods summed up. A reconcile computes this once and hands it to each policy
    that needs it (with 1,024 pods it takes ~1 ms, and a reconcile runs every second)."""
    groups: dict[int, list[PodView]] = {}
    for pod in pods:
        if pod.index >= 0:
            group = groups.get(pod.index)
            if group is None:
                groups[pod.index] = [pod]
            else:
                group.append(pod)
    out: ByIndex = {}
    for index, group in groups.items():
        group.sort(key=_newest_first, reverse=True)
        newest = group[0]
        last_failed = next((p for p in group if p.counted_failure), None)
        out[index] = IndexFailures(index, newest.failure_count + (last_failed is newest), newest, last_failed)
    return out


@dataclass(frozen=True)
class ChildView:
    """A Service, ConfigMap or NetworkPolicy of a job (labelled as one)."""

    kind: str
    name: str
    owner_uid: str = ""


@dataclass(frozen=True)
class WarningEvent:
    """The latest Warning event about an object: what its own status may not say (FailedMount,
    the Job controller's FailedCreate)."""

    reason: str
    message: str
    time: datetime | None = None  # when it was last seen


@dataclass
class Observed:
    job: JobView | None = None
    pods: list[PodView] = field(default_factory=list)
    progress: JobProgress | None = None
    # The aggregator's count of changes that `progress` reflects (Aggregator.written reads it).
    progress_changes: int | None = None
    # The latest Warning event about a pod or the Job that has not started, by the object's uid
    # (read only for those: policies.start says which).
    events: dict[str, WarningEvent] = field(default_factory=dict)
    # When a pod's clock of policies.start began, where not at its creation (its gate was lifted later).
    start_clocks: dict[str, datetime] = field(default_factory=dict)
    # The job's Services, ConfigMaps and NetworkPolicies that it owns, and those it should have
    # (kind, name); None: not known (nothing is restored).
    children: frozenset[tuple[str, str]] | None = None
    expected_children: frozenset[tuple[str, str]] = frozenset()
    # The operator's price per GPU-hour (a job's annotation overrides it: policies.cost).
    price_per_gpu_hour: float | None = None


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
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        owner_uid=controller_uid(body),
    )


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def pod_view(body: Mapping[str, Any]) -> PodView:
    meta, status = body.get("metadata", {}), body.get("status") or {}
    termination, counts, finished, cache_sample, merged, merged_steps = None, None, None, None, None, None
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if not term:
            continue
        finished = term.get("finishedAt") or finished
        message = term.get("message", "") or ""
        report = contract.Termination.parse(message) if message else None
        if report is not None:
            counts, cache_sample, merged = report.counts, report.cache_sample, report.job
            merged_steps = report.checkpoints
        if term.get("exitCode", 0) != 0:
            termination = ContainerExit(exit_code=int(term.get("exitCode", 1)), reason=term.get("reason", ""),
                                      message=message)
    annotations = meta.get("annotations") or {}
    reason, message = waiting(status)
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
        merged=merged,
        merged_steps=merged_steps,
        cache_sample=cache_sample,
        gated=bool((body.get("spec") or {}).get("schedulingGates")),
        owner_uid=controller_uid(body),
        scheduled=bool((body.get("spec") or {}).get("nodeName")),
        generation=_int(meta.get("generation"), 1),
        waiting_reason=reason,
        waiting_message=message,
    )


def waiting(status: Mapping[str, Any]) -> tuple[str, str]:
    """Why a pod that has not started waits, as its status says: a container's waiting reason
    (ErrImagePull, ImagePullBackOff, CreateContainerConfigError naming a missing Secret, ...), else
    the scheduler's verdict (Unschedulable, with what each node lacks); ("", "") while it is on its way."""
    if status.get("phase", "Pending") != "Pending":
        return "", ""
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        state = (cs.get("state") or {}).get("waiting") or {}
        if (state.get("reason") or "") not in STARTING_REASONS:
            return state["reason"], state.get("message") or ""
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" \
                and c.get("reason") not in ("", None, SCHEDULING_GATED):
            return c["reason"], c.get("message") or ""
    return "", ""


def child_view(body: Mapping[str, Any]) -> ChildView:
    meta = body.get("metadata") or {}
    return ChildView(kind=body.get("kind", ""), name=meta.get("name", ""), owner_uid=controller_uid(body))


def controller_uid(body: Mapping[str, Any]) -> str:
    """The uid of the object's controller (its owner reference with controller: true), or ""."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


def controller_name(body: Mapping[str, Any], kind: str) -> str | None:
    """The name of the object's controller when it is of `kind` (what the kopf indexes key by)."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == kind:
            return str(ref.get("name") or "") or None
    return None


def owner_of(body: Mapping[str, Any]) -> str | None:
    return ((body.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB)


def merged_progress(progress: JobProgress | None, pods: list[PodView]) -> JobProgress | None:
    """The job's progress, with the merged manifest's counts once the first pod merged (its termination
    message says what the merge found): the status then says what the output holds, not what the pods
    counted while they rendered (which a retry or a kept chunk may have counted otherwise)."""
    first = next((p for p in pods if p.index == 0 and p.terminal and p.merged is not None), None)
    if first is None or first.merged is None:
        return progress
    merged, steps = first.merged, first.merged_steps
    done = merged.completed + merged.skipped
    total = merged.total or (progress.total if progress is not None else 0)
    base = progress or JobProgress(completed=0, failed=0, total=total, percent=None, images_per_second=None,
                                   estimated_seconds_remaining=None, ranks=0, indexes={})
    return dataclasses.replace(base, completed=done, failed=merged.failed, total=total, kept=merged.skipped,
                               rerendered=merged.rerendered, estimated_seconds_remaining=0, merged=True,
                               steps_saved=steps.saved if steps is not None else None,
                               steps_lost=steps.lost if steps is not None else None,
                               percent=min(100.0, round(100.0 * (done + merged.failed) / total, 1)) if total else None)
