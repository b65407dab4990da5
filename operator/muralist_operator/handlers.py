"""kopf handlers: observe, decide (lifecycle.decide), write status once, act, then post events.

Every trigger — the DiffusionJob changing, one of its Jobs, pods or progress ConfigMap
changing, or the clock for deadlines, stall detection and TTL — runs the same level-based
`Reconciler.reconcile`. Children are read from kopf's in-memory indexes, so a reconcile
costs one GET (the job itself, fresh, because the status it decides from must be current).

No handler here needs a finalizer: deleting a DiffusionJob never waits for the operator, and
the garbage collector removes its children through their owner references.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kopf
from muralist_runtime.spec.api import GROUP, PLURAL, VERSION, DiffusionJob
from muralist_runtime.spec.problems import ValidationProblem, parse_job
from muralist_runtime.spec.status import TERMINAL_PHASES, DiffusionJobStatus
from pydantic import ValidationError

from muralist_operator import metrics
from muralist_operator.decision import (
    REASON_INVALID_SPEC,
    REASON_RENDER_FAILED,
    CreateJob,
    Decision,
    DeleteJob,
    DeleteSelf,
    SetJobSuspend,
    decide_failed,
)
from muralist_operator.kube import Kube
from muralist_operator.lifecycle import decide
from muralist_operator.observe import Observed, job_view, owner_of, pod_view, rank_reports
from muralist_operator.render import LABEL_COMPONENT, LABEL_JOB, Children, OperatorSettings, render_children

log = logging.getLogger("muralist.operator")
Key = tuple[str, str]
CLOCK_SECONDS = 2.0
RESYNC_SECONDS = 60.0
CREATE_GRACE_SECONDS = 10.0


class RenderFailure(Exception):
    """The children of a valid job could not be rendered (a bug, or a limit only render sees)."""


class Reconciler:
    def __init__(self, kube: Kube, settings: OperatorSettings):
        self.kube = kube
        self.settings = settings
        self._locks: dict[Key, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.indexes: dict[str, Any] = {}
        # Every DiffusionJob seen (resynced now and then, in case an event was missed), and
        # those that need the clock: a deadline, a stall timeout or a TTL.
        self.known: set[Key] = set()
        self.clocked: set[Key] = set()
        # (attempt, when) of the Job we last created: the index may not show it for a moment,
        # and the burst of events right after a creation should not re-create it.
        self.created: dict[Key, tuple[int, float]] = {}

    def _lock(self, key: Key) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def remember_indexes(self, kwargs: dict[str, Any]) -> None:
        for name in ("muralist_jobs", "muralist_pods", "muralist_progress"):
            if name in kwargs:
                self.indexes[name] = kwargs[name]

    def observe(self, key: Key) -> Observed:
        def values(index: str) -> list[Any]:
            store = self.indexes.get(index, {})
            return list(store.get(key, ())) if key in store else []

        jobs = values("muralist_jobs")
        ranks: dict[str, Any] = {}
        for reports in values("muralist_progress"):
            ranks.update(reports)
        return Observed(job=jobs[0] if jobs else None, pods=values("muralist_pods"), ranks=ranks)

    def reconcile(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        with self._lock(key), metrics.RECONCILE_SECONDS.time():
            body = self.kube.get_diffusion_job(namespace, name)
            if body is None:
                self.forget(key)
                return
            self._reconcile(key, body)

    def forget(self, key: Key) -> None:
        self.known.discard(key)
        self.clocked.discard(key)
        self.created.pop(key, None)
        metrics.forget(key)
        with self._locks_guard:
            self._locks.pop(key, None)

    def _reconcile(self, key: Key, body: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        self.known.add(key)
        raw_status = body.get("status") or {}
        try:
            status = DiffusionJobStatus.model_validate(raw_status)
        except ValidationError:
            status = DiffusionJobStatus()
        generation = body["metadata"].get("generation")
        manifest = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
        job: DiffusionJob | None = None
        children: Children | None = None
        try:
            job = parse_job(manifest)
            decision = decide(job, status, generation, self.observe(key), now)
            children = self._render(job, key, decision)
        except ValidationProblem as e:
            job, decision = None, decide_failed(status, generation, REASON_INVALID_SPEC, "; ".join(e.problems), now)
        except RenderFailure as e:
            job, decision = None, decide_failed(status, generation, REASON_RENDER_FAILED, str(e), now)

        new_status = decision.status.wire()
        if new_status != raw_status:
            self.kube.patch_status(key[0], key[1], new_status)
        suppressed = self._act(body, decision, children) if job is not None else set()
        for event in decision.events:
            if event.reason in suppressed:
                continue
            self.kube.post_event(body, event.type, event.reason, event.message)
        if decision.status.restarts > status.restarts:
            reason = decision.events[-1].reason if decision.events else "Unknown"
            metrics.RESTARTS.labels(reason=reason).inc()
        self._track(key, job, decision)

    def _render(self, job: DiffusionJob, key: Key, decision: Decision) -> Children | None:
        """The children a CreateJob needs, rendered before the status is written: a job that
        cannot be rendered fails with the reason instead of waiting for pods forever."""
        create = next((a for a in decision.actions if isinstance(a, CreateJob)), None)
        if create is None:
            return None
        try:
            return render_children(job, key[0], self.settings, attempt=create.attempt,
                                   active_deadline_seconds=create.active_deadline_seconds)
        except Exception as e:  # pure code: whatever it raises, retrying the same spec repeats it
            log.exception("rendering %s/%s failed", *key)
            raise RenderFailure(f"the operator cannot build this job's pods: {e}") from e

    def _act(self, owner: dict[str, Any], decision: Decision, children: Children | None) -> set[str]:
        """Carry out the actions; returns the event reasons that did not happen after all."""
        ns, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
        suppressed: set[str] = set()
        for action in decision.actions:
            if isinstance(action, CreateJob):
                if children is None or not self._create_children(owner, action, children):
                    suppressed.add("JobCreated")
            elif isinstance(action, DeleteJob):
                log.info("deleting Job %s/%s: %s", ns, name, action.reason)
                self.kube.delete_job(ns, name)
            elif isinstance(action, SetJobSuspend):
                self.kube.set_job_suspend(ns, name, action.suspend)
            elif isinstance(action, DeleteSelf):
                log.info("deleting DiffusionJob %s/%s: %s", ns, name, action.reason)
                self.kube.delete_diffusion_job(ns, name)
        return suppressed

    def _create_children(self, owner: dict[str, Any], action: CreateJob, children: Children) -> bool:
        """True when this call created the Job (not a repeat while the index catches up)."""
        key = (owner["metadata"]["namespace"], owner["metadata"]["name"])
        attempt, when = self.created.get(key, (-1, 0.0))
        if attempt == action.attempt and time.monotonic() - when < CREATE_GRACE_SECONDS:
            return False
        self.created[key] = (action.attempt, time.monotonic())
        created_job = False
        for child in children.all():
            created = self.kube.create(child, owner)
            created_job = created_job or (created and child["kind"] == "Job")
        return created_job

    def _track(self, key: Key, job: DiffusionJob | None, decision: Decision) -> None:
        phase = decision.status.phase
        metrics.observe_phase(key, str(phase))
        if job is None:
            self.clocked.discard(key)
            return
        policy = job.spec.run_policy
        if phase in TERMINAL_PHASES:
            needs_clock = policy.ttl_seconds_after_finished is not None
        else:
            needs_clock = bool(policy.active_deadline_seconds or policy.stall_timeout_seconds)
        if needs_clock:
            self.clocked.add(key)
        else:
            self.clocked.discard(key)

    def safe_reconcile(self, namespace: str, name: str) -> None:
        try:
            self.reconcile(namespace, name)
        except Exception:  # the clock must keep ticking for every other job
            log.exception("reconcile of %s/%s failed", namespace, name)

    def run_clock(self, stop: threading.Event) -> None:
        """Deadlines, stall timeouts and TTLs are about time, not events: tick for those jobs,
        and now and then resync every job in case an event was missed."""
        last_resync = time.monotonic()
        while not stop.wait(CLOCK_SECONDS):
            if not self.indexes:
                continue  # kopf has not finished its first listing: nothing is known yet
            keys = set(self.clocked)
            if time.monotonic() - last_resync > RESYNC_SECONDS:
                keys |= set(self.known)
                last_resync = time.monotonic()
            for namespace, name in sorted(keys):
                self.safe_reconcile(namespace, name)


RECONCILER: Reconciler | None = None


def reconciler() -> Reconciler:
    if RECONCILER is None:
        raise RuntimeError("the operator has not started")
    return RECONCILER


# -- indexes: what the operator knows about children, kept current by kopf's watches


@kopf.index("batch", "v1", "jobs", labels={LABEL_JOB: kopf.PRESENT})
def muralist_jobs(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return {(namespace, owner_of(body)): job_view(body)}  # type: ignore[dict-item]


@kopf.index("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "worker"})
def muralist_pods(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return {(namespace, owner_of(body)): pod_view(body)}  # type: ignore[dict-item]


@kopf.index("", "v1", "configmaps", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "progress"})
def muralist_progress(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return {(namespace, owner_of(body)): rank_reports(body.get("data"))}  # type: ignore[dict-item]


# -- triggers


@kopf.on.event(GROUP, VERSION, PLURAL)
def diffusion_job_event(namespace: str, name: str, type: str | None, **kwargs: Any) -> None:
    r = reconciler()
    r.remember_indexes(kwargs)
    if type == "DELETED":
        r.forget((namespace, name))
        return
    r.reconcile(namespace, name)


def _child_event(namespace: str, body: kopf.Body, kwargs: dict[str, Any]) -> None:
    owner = owner_of(body)
    if owner:
        r = reconciler()
        r.remember_indexes(kwargs)
        r.reconcile(namespace, owner)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_JOB: kopf.PRESENT})
def job_event(namespace: str, body: kopf.Body, **kwargs: Any) -> None:
    _child_event(namespace, body, kwargs)


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "worker"})
def pod_event(namespace: str, body: kopf.Body, **kwargs: Any) -> None:
    _child_event(namespace, body, kwargs)


@kopf.on.event("", "v1", "configmaps", labels={LABEL_JOB: kopf.PRESENT, LABEL_COMPONENT: "progress"})
def progress_event(namespace: str, body: kopf.Body, **kwargs: Any) -> None:
    _child_event(namespace, body, kwargs)
