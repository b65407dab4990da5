"""A reconcile's first step: what is known of a job, as one `observe.Observed`.

Its children as kopf's indexes hold them (indexes.py: only those it owns, by uid, whatever their
names or labels say), the progress its pods pushed (the aggregator, with a finished pod's
termination message counted as its last word), when this operator saw each pod that has not
started become startable (policies.start times them from then), and the latest Warning event
about pods that wait (read from the API server, at most now and then). Reads memory but for
those events; keeps the start clocks and the events between reconciles, by job.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from muralist_api.contract.progress import ProgressReport
from muralist_api.job import DiffusionJob

from muralist_operator.indexes import CHILD_INDEXES, Index, Indexes, Key
from muralist_operator.kube import Kube
from muralist_operator.observe import ChildView, JobView, Observed, PodView, WarningEvent, merged_progress
from muralist_operator.policies import start
from muralist_operator.progress.aggregate import Aggregator
from muralist_operator.render import child_names
from muralist_operator.settings import OperatorSettings

log = logging.getLogger("muralist.operator")


class Observer:
    def __init__(self, indexes: Indexes, aggregator: Aggregator, kube: Kube) -> None:
        self.indexes = indexes
        self.aggregator = aggregator
        self.kube = kube
        # policies.start's clocks that begin when the operator sees something (a pod's gate lifted,
        # an index without a pod), by job: None marks a pod seen behind its gate.
        self.start_clocks: dict[Key, dict[str, datetime | None]] = {}
        # The Warning events last read for a job's pods that do not start: (when, about which, what).
        self.warnings: dict[Key, tuple[float, tuple[str, ...], dict[str, WarningEvent]]] = {}

    def forget(self, key: Key) -> None:
        self.start_clocks.pop(key, None)
        self.warnings.pop(key, None)

    def observe(self, key: Key, job: DiffusionJob | None, settings: OperatorSettings,
                now: datetime | None = None) -> Observed:
        """The job's children as the indexes hold them: only those it owns (by uid), whatever their
        names or labels say; the pods of its Job, with a completion index."""
        now = now or datetime.now(UTC)
        uid = (job.metadata.uid or "") if job is not None else ""
        jobs: list[JobView] = [j for j in self.indexes.values(Index.JOBS, key) if j.owner_uid == uid]
        current = jobs[0] if jobs else None
        pods: list[PodView] = [p for p in self.indexes.values(Index.PODS, key)
                               if current is not None and p.owner_uid == current.uid and p.index >= 0]
        if job is not None:
            self.aggregator.set_total(key, job.total_images)
        for pod in pods:
            if pod.terminal and pod.counts is not None and pod.index >= 0:
                # The termination message is the source of truth for a finished pod's counts,
                # whether or not its posts reached us. Built, not validated: it is no post, and
                # an odd count in a message must not stop the reconcile.
                c = pod.counts
                self.aggregator.record(key, ProgressReport.model_construct(
                    pod=pod.name, index=pod.index, attempt=pod.failure_count, ranks=1, completed=c.completed,
                    skipped=c.skipped, failed=c.failed, total=c.total, rerendered=c.rerendered, last_step_time=None,
                    last_image_time=None, sent_at=datetime.now(UTC), final=True), now=None, posted=False)
        # Read before the snapshot: a report landing in between is then written again, not lost.
        changes = self.aggregator.changes(key)
        clocks = self._start_clocks(key, current, pods, now)
        found = start.waiting(pods, current, {}, clocks, now)
        owned: frozenset[tuple[str, str]] | None = None
        if job is not None and self.indexes.has(*CHILD_INDEXES):
            views: list[ChildView] = [c for index in CHILD_INDEXES for c in self.indexes.values(index, key)]
            owned = frozenset((c.kind, c.name) for c in views if c.owner_uid == uid)
        progress = merged_progress(self.aggregator.snapshot(key), pods)
        return Observed(job=current, pods=pods, progress=progress, progress_changes=changes,
                        events=self._warning_events(key, start.event_subjects(found, now)), start_clocks=clocks,
                        children=owned,
                        expected_children=child_names(job, settings) if job is not None else frozenset(),
                        price_per_gpu_hour=settings.price_per_gpu_hour)

    def _start_clocks(self, key: Key, current: JobView | None, pods: list[PodView],
                      now: datetime) -> dict[str, datetime]:
        """When this operator saw each pod's scheduling gate lifted (or, for a pod first seen after
        that, its spec changed since its creation: generation past 1), and each index of the Job
        without a pod (policies.start times them from then)."""
        known = self.start_clocks.get(key, {})
        kept: dict[str, datetime | None] = {}
        for pod in pods:
            if pod.gated:
                kept[pod.uid] = None
            elif pod.phase == "Pending" and (pod.uid in known or pod.generation > 1):
                kept[pod.uid] = known.get(pod.uid) or now
        if current is not None:
            for index in start.missing_indexes(current, pods):
                clock = start.index_clock(current.uid, index)
                kept[clock] = known.get(clock) or now
        if kept or key in self.start_clocks:
            self.start_clocks[key] = kept
        return {k: v for k, v in kept.items() if v is not None}

    def _warning_events(self, key: Key, uids: list[str]) -> dict[str, WarningEvent]:
        """The latest Warning event about each of `uids` (at most start.SHOWN), read again after
        start.EVENTS_AGAIN_SECONDS or when the uids change; none while nothing waits."""
        subjects = tuple(uids[:start.SHOWN])
        if not subjects:
            self.warnings.pop(key, None)
            return {}
        cached = self.warnings.get(key)
        if cached is not None and cached[1] == subjects and time.monotonic() - cached[0] < start.EVENTS_AGAIN_SECONDS:
            return cached[2]
        found: dict[str, WarningEvent] = {}
        for uid in subjects:
            try:
                event = self.kube.latest_warning(key[0], uid)
            except Exception as e:  # what a pod waits for is worth a look, not a failed reconcile
                log.warning("could not read the events of %s in %s: %s", uid, key[0], e)
                continue
            if event is not None:
                found[uid] = event
        self.warnings[key] = (time.monotonic(), subjects, found)
        return found
