"""runPolicy.startTimeoutSeconds: pods that never start are named, and in the end fail the job.

A pod has started once a container of it has run (its phase is past Pending): from then on what
it does is the stall policy's and the failure policy's. Until then it waits for something, and
status says what (the PodsNotStarting condition, and the phase's message), taken from, in turn:

- the pod's own status: a container's waiting reason other than ContainerCreating (ErrImagePull,
  ImagePullBackOff, InvalidImageName, CreateContainerConfigError naming the Secret or ConfigMap
  that is missing, ...), else the scheduler's verdict (Unschedulable, with what each node lacks,
  or the PersistentVolumeClaim that does not exist): observe.waiting;
- the latest Warning event about it, for a pod that waits without a reason of its own past
  NOTICE_SECONDS (a volume that cannot be mounted leaves the pod ContainerCreating: only the
  kubelet's FailedMount event says why);
- for an index that has no pod at all: the Job controller could not create it. Kubernetes 1.36
  says why only in an Event on the Job (FailedCreate: an admission rejection such as Pod
  Security, an exceeded quota); the Job's status has no condition for it.

A reason that is a problem is named at once; a pod that is merely slow (ContainerCreating, not
scheduled yet, not created yet) once it has waited NOTICE_SECONDS. The job fails, with the
reason of the pod that waited longest, once one has waited runPolicy.startTimeoutSeconds
(default DEFAULT_START_TIMEOUT_SECONDS), whatever it waits for: an image that takes that long to
pull is as stuck, for this job, as one that cannot be pulled.

Each pod has a clock of its own, from its creation (a retried pod is a new pod), or from when the
operator saw its scheduling gate lifted (a pod whose spec changed since its creation, first seen
after that: from then); an index without a pod, from when the operator first saw it without one
(`clocks`, kept by the reconciler: an operator that restarts starts those again, which only ever
waits longer). Such an index is timed only when an event of the Job's says why
(FailedCreate): the Job controller holds back a failed index's next pod on purpose (its backoff).
Not timed either: a pod behind a scheduling gate (Kueue admits its size first), a pod being
deleted, and a suspended job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from muralist_api.pods import RunPolicy
from muralist_api.status import Phase

from muralist_operator.decision import DeleteJob, Transition, parse_time
from muralist_operator.observe import JobView, PodView, WarningEvent

CONDITION = "PodsNotStarting"
# A pod merely slow to start is named after this long; one with a problem of its own at once.
NOTICE_SECONDS = 30
# While a slow pod's reason is unknown, its events are read again this often.
EVENTS_AGAIN_SECONDS = 30
# An event of the Job's older than this is about an earlier attempt to create a pod.
EVENT_FRESH_SECONDS = 120
# Reasons that say only that a pod is slow, not what is wrong.
CREATING = "ContainerCreating"  # bound to a node, its containers not running yet
NOT_SCHEDULED = "Pending"  # no node yet, and no verdict of the scheduler's
NOT_CREATED = "PodNotCreated"  # the Job has not created the index's pod
SLOW = frozenset({CREATING, NOT_SCHEDULED, NOT_CREATED})
# Status lists this many waiting pods in the condition's message (the first is the phase's).
SHOWN = 3
MAX_MESSAGE = 500


@dataclass(frozen=True)
class Waiting:
    """An index whose pod has not started: what it waits for, since when."""

    index: int
    pod: str  # "" when the Job has not created it
    uid: str  # the pod's, or the Job's for an index without a pod (whose events say why)
    reason: str
    message: str
    since: datetime

    @property
    def problem(self) -> bool:
        """A reason that says what is wrong, not only that it is slow."""
        return self.reason not in SLOW

    def waited(self, now: datetime) -> int:
        return int((now - self.since).total_seconds())

    def describe(self) -> str:
        who = f"index {self.index} (pod {self.pod})" if self.pod else f"index {self.index}"
        return f"{who}: {self.reason}: {self.message}"[:MAX_MESSAGE] if self.message else f"{who}: {self.reason}"


def _slow_reason(pod: PodView) -> tuple[str, str]:
    if pod.scheduled:
        return CREATING, "its containers are being created (pulling the image, mounting volumes)"
    return NOT_SCHEDULED, "not scheduled yet"


def missing_indexes(current: JobView | None, pods: list[PodView]) -> list[int]:
    """The indexes of a started Job that have no pod at all."""
    if current is None or current.completions is None or not current.start_time or not _active(current):
        return []
    seen = {p.index for p in pods}
    return [i for i in range(current.completions) if i not in seen]


def index_clock(job_uid: str, index: int) -> str:
    """The key of `clocks` for an index without a pod."""
    return f"{job_uid}/{index}"


def _active(current: JobView) -> bool:
    return not (current.deleting or current.suspended or current.complete or current.failed)


def waiting(pods: list[PodView], current: JobView | None, events: Mapping[str, WarningEvent],
            clocks: Mapping[str, datetime], now: datetime) -> list[Waiting]:
    """The indexes whose pod has not started, by index. `pods`: the Job's pods of its current
    indexes; `events`: the latest Warning event by the uid of the pod (or Job) it is about;
    `clocks`: when a clock began where it is not a pod's creation: a pod whose gate was lifted (by
    its uid), an index without a pod (index_clock; without one: now, first seen)."""
    if current is None or not _active(current):
        return []
    found: list[Waiting] = []
    for pod in pods:
        if pod.phase != "Pending" or pod.deleting or pod.gated:
            continue
        since = clocks.get(pod.uid) or parse_time(pod.created) or now
        reason, message = pod.waiting_reason, pod.waiting_message
        if not reason:
            event = events.get(pod.uid)
            reason, message = (event.reason, event.message) if event is not None else _slow_reason(pod)
        found.append(Waiting(pod.index, pod.name, pod.uid, reason, message, since))
    # The Job's events are about every attempt to create a pod: only a recent one tells about now.
    event = events.get(current.uid)
    if event is not None and event.time is not None and (now - event.time).total_seconds() > EVENT_FRESH_SECONDS:
        event = None
    for index in missing_indexes(current, pods):
        since = clocks.get(index_clock(current.uid, index)) or now
        reason, message = (event.reason, event.message) if event is not None else (
            NOT_CREATED, "the Job has not created its pod")
        found.append(Waiting(index, "", current.uid, reason, message, since))
    return sorted(found, key=lambda w: (w.index, w.since))


def named(found: list[Waiting], now: datetime) -> list[Waiting]:
    """What status names: every problem, and what has been slow for NOTICE_SECONDS; longest waiting first."""
    shown = [w for w in found if w.problem or w.waited(now) >= NOTICE_SECONDS]
    return sorted(shown, key=lambda w: (not w.problem, w.since, w.index))


def event_subjects(found: list[Waiting], now: datetime) -> list[str]:
    """The uids whose Warning events may say what a slow pod waits for: the pods (and the Job, for
    an index without a pod) that have waited NOTICE_SECONDS without a reason of their own."""
    uids = [w.uid for w in found if w.reason in SLOW and w.waited(now) >= NOTICE_SECONDS]
    return list(dict.fromkeys(uids))


def timed_out(found: list[Waiting], policy: RunPolicy, now: datetime) -> Waiting | None:
    """The index that waited longest, once it has waited past the timeout. An index whose pod the
    Job has not created, with no event saying why, is not timed: the Job controller holds back a
    failed index's next pod on purpose (its backoff), and a Job controller that is down fails no job."""
    late = [w for w in found if w.waited(now) >= policy.start_timeout and w.reason != NOT_CREATED]
    return min(late, key=lambda w: (w.since, w.index)) if late else None


def next_check(found: list[Waiting], policy: RunPolicy, now: datetime) -> datetime | None:
    """When the status could next change with time alone: a slow pod to name, its events to read
    again, a pod past the timeout. None while nothing waits."""
    if not found:
        return None
    dues = [w.since + timedelta(seconds=policy.start_timeout + 1) for w in found if w.reason != NOT_CREATED]
    for w in found:
        if w.reason in SLOW:
            notice = w.since + timedelta(seconds=NOTICE_SECONDS)
            dues.append(notice if notice > now else now + timedelta(seconds=EVENTS_AGAIN_SECONDS))
    return max(now, min(dues))


def message(shown: list[Waiting]) -> str:
    more = f" (and {len(shown) - SHOWN} more)" if len(shown) > SHOWN else ""
    return "; ".join(w.describe() for w in shown[:SHOWN]) + more


def timeout_message(late: Waiting, policy: RunPolicy, now: datetime) -> str:
    setting = (f"runPolicy.startTimeoutSeconds={policy.start_timeout}" if policy.start_timeout_seconds
               else f"runPolicy.startTimeoutSeconds unset: the default, {policy.start_timeout}s")
    return f"{late.describe()}; not started after {late.waited(now)}s ({setting})"


def apply(t: Transition, policy: RunPolicy, found: list[Waiting], now: datetime) -> Waiting | None:
    """Name the pods that have not started in the PodsNotStarting condition (dropped once none
    waits); fail the job once one waited past the timeout; ask to be decided again when that could
    change with time alone (next_check). Returns the first one named."""
    due = next_check(found, policy, now)
    if due is not None:
        t.check_again(due)
    shown = named(found, now)
    if not shown:
        t.drop_condition(CONDITION)
        return None
    first = shown[0]
    t.condition(CONDITION, True, first.reason, message(shown)[:2000])
    late = timed_out(found, policy, now)
    if late is not None:
        t.phase(Phase.FAILED, late.reason, timeout_message(late, policy, now))
        t.act(DeleteJob(late.reason))
    return first
