"""The Reconciler: observe, decide (lifecycle.decide), write status once, act, then post events.

Every trigger (handlers.py: kopf's watches and indexes) runs the same level-based
`Reconciler.reconcile`: the DiffusionJob changing, one of its children changing (watched with
label selectors, so the API server sends only those labelled as a job's; `observe` counts only
those the job owns, by uid), a pod's pushed progress that changed
the counts (throttled per job by the aggregator), or the clock. Children are read from kopf's
in-memory indexes, and the job itself from the latest body its watch or our own status write
returned (only the operator writes status, so that one is current): a reconcile costs no read,
and the watch event that echoes our own status write costs nothing.

The clock (clock.py) reconciles a job only when something about it moves with time alone:
each reconcile ends by saying when that is next (`_track`: the deadline, the TTL, when a pod
could pass its stall timeout or the job's posts could fall silent, when a pod that has not
started is due to be named or timed out (policies.start), any `Decision.check_again_at`, and
counts waiting for the status-write throttle), and the job waits in a priority queue
(schedule.py) until then. A finished job without a TTL is not in it at all. A reconcile that
fails (the API server away: every call has a timeout, kube.py) is tried again with backoff. No
sweep re-reads every job: kopf's watches resume from their last resourceVersion and list again
when the API server no longer has it, and each object of a listing reaches the handlers.

What a reconcile observes is gathered by observer.py; the children it creates are rendered and
created by children.py.

The job and its status are read as skew.py says: what a newer CRD or operator wrote and this one
does not know never fails or resets a job, and a status it cannot read is kept and reported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from muralist_api.contract.progress import ProgressReport
from muralist_api.job import DiffusionJob
from muralist_api.planner.table import CannotPlan
from muralist_api.rules.problems import ValidationProblem
from muralist_api.status import TERMINAL_PHASES, Phase

from muralist_operator import metrics, planning, skew
from muralist_operator.children import ChildCreator, RenderFailure, render_for
from muralist_operator.decision import (
    REASON_CHILD_RESTORED,
    REASON_EARLIER_JOB,
    REASON_INVALID_SPEC,
    REASON_NAME_TAKEN,
    REASON_RENDER_FAILED,
    CreateJob,
    Decision,
    DeleteJob,
    DeleteSelf,
    ResizeJob,
    RestoreChildren,
    SetJobSuspend,
    StopPod,
    decide_failed,
    decide_waiting,
)
from muralist_operator.indexes import Index, Indexes, Key
from muralist_operator.kube import CALL_FAILED, Kube, NameHeld, NameTaken
from muralist_operator.lifecycle import decide
from muralist_operator.observe import JobView, Observed
from muralist_operator.observer import Observer
from muralist_operator.policies import deadline, stall, ttl
from muralist_operator.progress.aggregate import Aggregator
from muralist_operator.progress.auth import PodInfo
from muralist_operator.render import Children
from muralist_operator.schedule import Schedule, backoff
from muralist_operator.settings import OperatorSettings

log = logging.getLogger("muralist.operator")
# How soon a job whose child's name an earlier job's object still holds tries again (each of their
# deletions is an event that tries too).
NAME_HELD_RETRY_SECONDS = 5.0

__all__ = ["Key", "Reconciler", "RenderFailure"]


def _newer(rv: str | None, than: str | None) -> bool:
    """resourceVersions are opaque, but etcd's are increasing integers; anything else counts as newer."""
    try:
        return than is None or int(rv or 0) > int(than)
    except ValueError:
        return True


# What of status.cost changes on its own account (the GPUs running, the price) rather than with time.
_COST_SETTINGS = ("runningGpus", "pricePerGpuHour")


def _besides_progress(status: dict[str, Any]) -> dict[str, Any]:
    """The status but for what moves with the pods' work and time alone (the counts, the GPU-seconds and
    costs so far), which is written at the aggregator's pace or with any other change."""
    out = {k: v for k, v in status.items() if k != "progress"}
    if isinstance(out.get("cost"), dict):
        out["cost"] = {k: v for k, v in out["cost"].items() if k in _COST_SETTINGS}
    return out


class Reconciler:
    def __init__(self, kube: Kube, settings: OperatorSettings, aggregator: Aggregator | None = None,
                 is_active: Callable[[], bool] = lambda: True):
        self.kube = kube
        self.settings = settings
        self.aggregator = aggregator or Aggregator()
        self.is_active = is_active
        self._locks: dict[Key, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.indexes = Indexes()
        self.observer = Observer(self.indexes, self.aggregator, kube)
        self.creator = ChildCreator(kube)
        # The latest known body of each DiffusionJob (from its watch, or our own status write),
        # and how many triggers wait for each job's lock.
        self.bodies: dict[Key, dict[str, Any]] = {}
        self._waiting: dict[Key, int] = {}
        # Every DiffusionJob seen, and when the clock reconciles each one next (monotonic; only
        # those with something timed: see _track).
        self.known: set[Key] = set()
        self.schedule: Schedule[Key] = Schedule()
        # Reconciles that failed in a row, by job (the backoff of its next try), and the jobs
        # whose status write failed: their next reconcile reads them first.
        self._failures: dict[Key, int] = {}
        self._unsure: set[Key] = set()
        # Jobs whose next accepted post decides something (stall.awaits_post: it clears
        # ProgressUnreachable, or shows a quiet pod stalled): that post wakes them.
        self.awaiting_post: set[Key] = set()
        self.wake = self.schedule.wake  # set when a job becomes due earlier than any other
        # What was last said of a job whose status this operator cannot read (skew.py).
        self.unreadable: dict[Key, str] = {}

    @property
    def listed(self) -> bool:
        """kopf has filled every index from its first listing (indexes.Indexes.remember)."""
        return self.indexes.listed

    def _lock(self, key: Key) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    # -- what the progress endpoint asks (on its own thread: memory only, never blocking) --------

    def job_exists(self, namespace: str, name: str) -> bool:
        return bool(self.indexes.values(Index.DIFFUSION_JOBS, (namespace, name))) or (namespace, name) in self.known

    def pod_lookup(self, namespace: str, name: str) -> PodInfo | None:
        found = self.indexes.values(Index.POD_INFO, (namespace, name))
        return found[0] if found else None

    def workers_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the Job the DiffusionJob owns: the one whose pods may post its progress."""
        with self._locks_guard:
            body = self.bodies.get((namespace, name))
        uid = ((body or {}).get("metadata") or {}).get("uid")
        if not uid:
            return None
        jobs: list[JobView] = self.indexes.values(Index.JOBS, (namespace, name))
        return next((j.uid for j in jobs if j.owner_uid == uid), None)

    def on_report(self, namespace: str, job: str, report: ProgressReport) -> None:
        """A pod's post: into the aggregator; wake the clock only when the job has become due."""
        key = (namespace, job)
        before = self.aggregator.next_due(key)
        self.aggregator.record(key, report)
        after = self.aggregator.next_due(key)
        if key in self.awaiting_post:
            self.awaiting_post.discard(key)
            self.schedule.at(key, time.monotonic())
        elif before is None and after is not None:
            self.schedule.at(key, time.monotonic() + after)

    def on_refusal(self, namespace: str, job: str, status: int, reason: str) -> None:
        """A post the endpoint refused for a job (or could not check): the job's last error, which
        status shows once its posts stop (memory only, like `on_report`); a job that says so
        already is woken when the error is a new one."""
        key = (namespace, job)
        if self.aggregator.refused(key, status, reason) and key in self.awaiting_post:
            self.schedule.at(key, time.monotonic())

    # -- one reconcile -----------------------------------------------------------------------

    def observe(self, key: Key, job: DiffusionJob | None = None, now: datetime | None = None) -> Observed:
        return self.observer.observe(key, job, self.settings, now)

    def seen(self, key: Key, body: dict[str, Any]) -> bool:
        """A DiffusionJob from its watch: kept as the latest known. False when it is the echo of
        our own status write (nothing new to decide from)."""
        rv = (body.get("metadata") or {}).get("resourceVersion")
        with self._locks_guard:
            cached = self.bodies.get(key)
            known = (cached.get("metadata") or {}).get("resourceVersion") if cached else None
            if rv is not None and rv == known:
                return False
            if cached is None or _newer(rv, known):
                self.bodies[key] = body
        return True

    def _remember_body(self, key: Key, body: dict[str, Any] | None) -> None:
        with self._locks_guard:
            if body is None:
                self.bodies.pop(key, None)
                return
            cached = self.bodies.get(key)
            known = (cached.get("metadata") or {}).get("resourceVersion") if cached else None
            if cached is None or _newer((body.get("metadata") or {}).get("resourceVersion"), known):
                self.bodies[key] = body

    def reconcile(self, namespace: str, name: str, fresh: bool = False) -> None:
        """Reconcile from the latest known DiffusionJob (its watch events and our own status
        writes keep it current: only we write status), or GET it when unknown or `fresh`.
        A trigger that finds another one already waiting for this job returns at once: the
        waiting one reads everything after it gets its turn. One that fails is tried again by
        the clock, after a backoff that grows with each failure in a row."""
        key = (namespace, name)
        with self._locks_guard:
            if self._waiting.get(key) and not fresh:
                return
            self._waiting[key] = self._waiting.get(key, 0) + 1
        lock = self._lock(key)
        with lock, metrics.RECONCILE_SECONDS.time():
            with self._locks_guard:
                self._waiting[key] = self._waiting.get(key, 1) - 1
                body = None if fresh or key in self._unsure else self.bodies.get(key)
            try:
                if body is None:
                    body = self.kube.get_diffusion_job(namespace, name)
                    if body is None:
                        self.forget(key)
                        return
                    self._remember_body(key, body)
                    self._unsure.discard(key)
                self._reconcile(key, body)
            except Exception:
                self._retry_later(key)
                raise
            self._failures.pop(key, None)

    def _retry_later(self, key: Key) -> None:
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        self.schedule.at(key, time.monotonic() + backoff(failures))

    def forget(self, key: Key) -> None:
        self.known.discard(key)
        self.awaiting_post.discard(key)
        self._unsure.discard(key)
        self.schedule.drop(key)
        self._failures.pop(key, None)
        self.creator.forget(key)
        self.observer.forget(key)
        self.unreadable.pop(key, None)
        self.aggregator.forget(key)
        metrics.forget(key)
        with self._locks_guard:
            self._locks.pop(key, None)
            self.bodies.pop(key, None)
            self._waiting.pop(key, None)

    def _reconcile(self, key: Key, body: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        self.known.add(key)
        # What a newer operator or CRD wrote and this one does not know is set aside, never a reason to
        # fail or reset the job (skew.py); a status it cannot read at all is kept, and reported.
        reading = skew.read_status(body.get("status") or {})
        if reading.status is None:
            self._status_unreadable(key, body, reading)
            return
        self.unreadable.pop(key, None)
        status, raw_status = reading.status, reading.known
        generation = body["metadata"].get("generation")
        manifest = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
        job: DiffusionJob | None = None
        children: Children | None = None
        observed: Observed | None = None
        try:
            started = status.phase != Phase.PENDING or bool(self.indexes.values(Index.JOBS, key))
            rules: list[str] = []
            try:
                job, unknown = skew.read_job(manifest, started)
            except ValidationProblem as refused:  # a rule added since a running job was admitted
                (job, rules), unknown = skew.read_admitted(manifest, started, refused), []
            if planning.is_auto(job):  # planned once, then kept in status (planning.py)
                if status.parallel_plan is None and status.phase not in TERMINAL_PHASES:
                    status.parallel_plan = planning.plan_for(job, self.kube.node_labels(planning.node_selector(job)))
                if status.parallel_plan is not None:
                    job = planning.apply(job, status.parallel_plan)
            observed = self.observe(key, job, now)
            decision = decide(job, status, generation, observed, now)
            if job.status is not None and job.status.parallel_plan is not None:
                planning.note(decision, job.status.parallel_plan, now, generation)
            skew.note_unknown(decision, unknown + reading.unknown, now, generation, rules)
            children = render_for(job, key, decision, self.settings)
        except CannotPlan as e:
            job, decision = None, decide_failed(status, generation, planning.REASON_CANNOT_PLAN, str(e), now)
        except skew.NewerSpec as e:
            job, decision = None, skew.wait_for_operator(status, generation, e, now)
        except ValidationProblem as e:
            job, decision = None, decide_failed(status, generation, REASON_INVALID_SPEC, "; ".join(e.problems), now)
        except RenderFailure as e:
            job, decision = None, decide_failed(status, generation, REASON_RENDER_FAILED, str(e), now)

        # status.progress is written when the aggregator's throttle says so (the counts changed,
        # at most once per write interval; the rate alone moves with time and is not worth a
        # write), or together with any other change of the status.
        # Children first (the Job is what everything waits for), then one status write, then
        # the events, only once the status says what they announce.
        try:
            suppressed = self._act(body, decision, children) if job is not None else set()
        except NameTaken as e:  # a child's name is someone else's: the job cannot run
            current = observed.job if observed is not None else None
            decision = decide_failed(status, generation, REASON_NAME_TAKEN, str(e), now)
            if current is not None and not current.deleting:
                self.kube.delete_job(*key)  # its pods would use the stranger's object as their own
            suppressed = set()
        except NameHeld as e:  # a job of this name was deleted a moment ago: create ours once its objects are gone
            decision = decide_waiting(status, generation, REASON_EARLIER_JOB, str(e), now)
            decision.check_again_at = now + timedelta(seconds=NAME_HELD_RETRY_SECONDS)
            self.creator.forget(key)  # their deletion's event comes before the creation grace would end
            suppressed = set()
        new_status = decision.status.wire()
        changes_seen = observed.progress_changes if observed is not None else None
        due = self.aggregator.next_due(key) == 0
        # The merged manifest's counts are the job's last word on its items: written when they differ, unthrottled.
        final = observed is not None and observed.progress is not None and observed.progress.merged
        besides = _besides_progress(new_status) != _besides_progress(raw_status)
        if new_status != raw_status and (due or final or besides):
            try:
                written = self.kube.patch_status(key[0], key[1], new_status)
            except Exception:
                self.aggregator.mark_dirty(key)
                # Read it again next time (the write may have landed after all); until then the
                # body stays what the progress endpoint's lookups read (workers_uid).
                self._unsure.add(key)
                raise
            self._remember_body(key, written)
            self.aggregator.written(key, changes_seen)
        elif due:
            self.aggregator.written(key, changes_seen)  # nothing to write: the counts are already there
        for event in decision.events:
            if event.reason in suppressed:
                continue
            self.kube.post_event(body, event.type, event.reason, event.message)
        if decision.status.restarts > status.restarts:
            reasons = [e.reason for e in decision.events if e.type == "Warning"] or ["Unknown"]
            metrics.RESTARTS.labels(reason=reasons[0]).inc(decision.status.restarts - status.restarts)
        self._track(key, job, decision, observed, now)

    def _status_unreadable(self, key: Key, body: dict[str, Any], reading: skew.StatusReading) -> None:
        """Say once (until it changes) that this job's status cannot be read; it stays as it is."""
        message = skew.unreadable_message(reading)
        if self.unreadable.get(key) != message:
            log.warning("%s/%s: %s", *key, message)
            self.kube.post_event(body, "Warning", skew.REASON_STATUS_UNREADABLE, message)
            self.unreadable[key] = message

    def _act(self, owner: dict[str, Any], decision: Decision, children: Children | None) -> set[str]:
        """Carry out the actions; returns the event reasons that did not happen after all."""
        ns, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
        suppressed: set[str] = set()
        for action in decision.actions:
            if isinstance(action, CreateJob):
                if children is None or not self.creator.create(owner, children):
                    suppressed.add("JobCreated")
            elif isinstance(action, RestoreChildren):
                if children is None or not self.creator.restore(owner, children, action, decision):
                    suppressed.add(REASON_CHILD_RESTORED)
            elif isinstance(action, DeleteJob):
                log.info("deleting Job %s/%s: %s", ns, name, action.reason)
                self.kube.delete_job(ns, name)
            elif isinstance(action, SetJobSuspend):
                self.kube.set_job_suspend(ns, name, action.suspend)
            elif isinstance(action, ResizeJob):
                log.info("resizing Job %s/%s to %d pod(s)", ns, name, action.nodes)
                self.kube.resize_job(ns, name, action.nodes)
            elif isinstance(action, StopPod):
                log.info("deleting pod %s/%s: %s", ns, action.name, action.note)
                self.kube.stop_pod(ns, action.name, action.uid, action.reason, action.note)
            elif isinstance(action, DeleteSelf):
                log.info("deleting DiffusionJob %s/%s: %s", ns, name, action.reason)
                self.kube.delete_diffusion_job(ns, name)
                self._remember_body((ns, name), None)
        return suppressed

    def _track(self, key: Key, job: DiffusionJob | None, decision: Decision, observed: Observed | None,
               now: datetime) -> None:
        """When the clock reconciles this job next: the earliest moment a verdict could change with
        time alone (the queue forgets a job with none), or sooner when its counts wait to be written."""
        phase = decision.status.phase
        metrics.observe_phase(key, str(phase))
        metrics.observe_cost(key, decision.status.cost)
        dues = [decision.check_again_at]
        awaiting_post = False
        if job is not None:
            policy = job.spec.run_policy
            if phase in TERMINAL_PHASES:
                dues.append(ttl.due(decision.status, policy))
            else:
                dues.append(deadline.due(decision.status, policy))
                if observed is not None:
                    dues.append(stall.next_check(job.spec, observed.progress, observed.pods, now))
                    awaiting_post = stall.awaits_post(job.spec, observed.progress, observed.pods, now)
                    # (policies.start asks through check_again_at: a pod to name, or past its start timeout)
        if awaiting_post:
            self.awaiting_post.add(key)
        else:
            self.awaiting_post.discard(key)
        due = min((d for d in dues if d is not None), default=None)
        clock = time.monotonic()
        self.schedule.replace(key, None if due is None else clock + max(0.0, (due - now).total_seconds()))
        # After the replace: a report that lands meanwhile schedules its write itself (on_report).
        pending = self.aggregator.next_due(key)
        if pending is not None:
            self.schedule.at(key, clock + pending)

    def safe_reconcile(self, namespace: str, name: str) -> None:
        try:
            self.reconcile(namespace, name)
        except CALL_FAILED as e:  # the API server away or refusing: one line
            when = self.schedule.when((namespace, name))
            again = f"; tried again in {max(0.0, when - time.monotonic()):.0f}s" if when is not None else ""
            log.warning("reconcile of %s/%s failed: %s%s", namespace, name, e, again)
        except Exception:  # the clock must keep ticking for every other job (this one is retried)
            log.exception("reconcile of %s/%s failed", namespace, name)
