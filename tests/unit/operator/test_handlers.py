"""The reconciler: a job whose children cannot be rendered fails with the reason; what it writes
from pushed progress, and when."""

from __future__ import annotations

import copy
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from muralist_api.contract import Counts
from muralist_api.contract.progress import ProgressReport
from muralist_api.status import DiffusionJobStatus
from muralist_operator import children, handlers
from muralist_operator import reconciler as reconciler_module
from muralist_operator.clock import Clock as ClockThread
from muralist_operator.decision import CreateJob, Decision
from muralist_operator.indexes import Index
from muralist_operator.naming import LABEL_JOB
from muralist_operator.observe import PodView
from muralist_operator.progress.aggregate import Aggregator
from muralist_operator.reconciler import Reconciler
from muralist_operator.settings import OperatorSettings

from tests.builders import make_job
from tests.kube_helpers import wait_for
from tests.views import NOW, job_view, pod


def test_a_render_failure_becomes_a_permanent_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise KeyError("volumes")

    monkeypatch.setattr(children, "render_children", broken)
    decision = Decision(DiffusionJobStatus(), actions=[CreateJob(None)])
    with pytest.raises(children.RenderFailure, match="cannot build this job's pods: 'volumes'"):
        children.render_for(make_job().job(), ("ns", "cats"), decision, OperatorSettings())
    # Without a pod group to create, nothing is rendered.
    nothing = Decision(DiffusionJobStatus())
    assert children.render_for(make_job().job(), ("ns", "cats"), nothing, OperatorSettings()) is None


# -- the reconciler against a fake API: what it writes, and when


class FakeKube:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body, self.patches, self.created, self.events, self.stopped = body, [], [], [], []

    def get_diffusion_job(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.body)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        self.body["status"] = status
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.body)

    def create(self, obj: dict[str, Any], owner: dict[str, Any]) -> bool:
        self.created.append(obj["kind"])
        return True

    def post_event(self, owner: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append(reason)

    def stop_pod(self, namespace: str, name: str, uid: str, reason: str, note: str) -> None:
        self.stopped.append(name)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def running_reconciler(pods: list[PodView]) -> tuple[Reconciler, FakeKube, Clock]:
    body = make_job("cats").prompts(*["p"] * 10).world(nodes=2).obj()
    body["metadata"].update(namespace="ns", generation=1, resourceVersion="1")
    kube = FakeKube(body)
    clock = Clock()
    r = Reconciler(kube, OperatorSettings(), Aggregator(clock=clock))  # type: ignore[arg-type]
    r.indexes.remember({Index.JOBS: {KEY: [job_view()]}, Index.PODS: {KEY: pods}}, listed=False)
    r.reconcile(*KEY)
    assert kube.body["status"]["phase"] == "Running"
    kube.patches.clear()
    clock.now += 1.0  # that write counted for the throttle
    return r, kube, clock


KEY = ("ns", "cats")


def post(index: int, completed: int) -> ProgressReport:
    """A pod's post that has just stepped (no stall check is due for a while)."""
    now = datetime.now(UTC)
    return ProgressReport(pod=f"cats-{index}-0", index=index, attempt=0, ranks=1, completed=completed, skipped=0,
                          failed=0, total=10, last_step_time=now, last_image_time=now, sent_at=now, final=False)


def test_counts_are_written_at_most_once_per_interval_and_the_rate_alone_never() -> None:
    r, kube, clock = running_reconciler([pod(0), pod(1)])
    r.on_report("ns", "cats", post(0, 1))
    assert r.wake.is_set()  # the job became due: the clock thread wakes
    assert r.schedule.when(KEY) is not None and r.schedule.when(KEY) <= time.monotonic()
    r.reconcile(*KEY)
    assert [p["progress"]["completed"] for p in kube.patches] == [1]
    r.wake.clear()
    clock.now += 0.5
    r.on_report("ns", "cats", post(0, 3))
    assert r.wake.is_set()  # changed again: the clock thread sets its timer (due in 0.5 s)
    assert r.schedule.when(KEY) == pytest.approx(time.monotonic() + 0.5, abs=0.2)
    r.wake.clear()
    r.on_report("ns", "cats", post(1, 1))
    assert not r.wake.is_set()  # already due: no wake-up per post
    r.reconcile(*KEY)  # e.g. a pod event: the counts wait for the throttle
    assert len(kube.patches) == 1
    clock.now += 0.5
    r.reconcile(*KEY)
    assert [p["progress"]["completed"] for p in kube.patches] == [1, 4]
    clock.now += 30  # the rate decays with time alone: not worth a write
    r.reconcile(*KEY)
    assert len(kube.patches) == 2


def test_a_finished_pods_termination_message_counts() -> None:
    done = pod(1, "Succeeded", counts=Counts(completed=4, skipped=1, failed=0, total=10))
    r, kube, _ = running_reconciler([pod(0), done])
    r.reconcile(*KEY)
    assert kube.body["status"]["progress"]["completed"] == 5


def test_a_stalled_pod_is_stopped() -> None:
    r, kube, _ = running_reconciler([pod(0), pod(1)])
    kube.body["spec"]["runPolicy"] = {"stallTimeoutSeconds": 10}
    kube.body["metadata"]["resourceVersion"] = "100"
    assert r.seen(KEY, copy.deepcopy(kube.body))  # the user's change, from the watch
    stale = ProgressReport(pod="cats-1-0", index=1, attempt=0, ranks=1, completed=1, skipped=0, failed=0, total=10,
                           last_step_time=datetime.now(UTC) - timedelta(seconds=60), last_image_time=None,
                           sent_at=NOW, final=False)
    r.on_report("ns", "cats", stale)
    r.reconcile(*KEY)
    assert kube.stopped == ["cats-1-0"] and "Stalled" in kube.events


def test_every_running_job_gets_a_stall_check_when_a_pod_could_be_over() -> None:
    # No stallTimeoutSeconds: the default applies, and the clock thread wakes the job when its
    # quietest pod could pass it (not every tick: every running job has a timeout now).
    r, kube, _ = running_reconciler([pod(0), pod(1)])
    assert r.schedule.when(KEY) is None, "no pod has stepped: nothing to time"
    quiet = ProgressReport(pod="cats-1-0", index=1, attempt=0, ranks=1, completed=1, skipped=0, failed=0, total=10,
                           last_step_time=datetime.now(UTC) - timedelta(seconds=590), last_image_time=None,
                           sent_at=NOW, final=False)
    r.on_report("ns", "cats", quiet)
    r.reconcile(*KEY)
    due = r.schedule.when(KEY)
    assert kube.stopped == [] and due is not None
    assert 8 < due - time.monotonic() < 12, "due when the default (600 s) has passed"
    r.on_report("ns", "cats", quiet.model_copy(update={"pod": "cats-0-0", "index": 0,
                                                   "last_step_time": datetime.now(UTC) - timedelta(seconds=700)}))
    r.reconcile(*KEY)
    assert kube.stopped == ["cats-0-0"] and "Stalled" in kube.events


def test_the_echo_of_our_own_status_write_costs_nothing() -> None:
    r, kube, _ = running_reconciler([pod(0), pod(1)])
    echo = copy.deepcopy(kube.body)  # what the watch sends after our write
    assert r.seen(KEY, echo) is False
    older = copy.deepcopy(kube.body)
    older["metadata"]["resourceVersion"] = "0"
    assert r.seen(KEY, older) is True and r.bodies[KEY]["metadata"]["resourceVersion"] != "0"  # never goes back


def test_a_report_landing_while_the_reconcile_writes_an_older_snapshot_is_written_next() -> None:
    # A pod's final post lands between the reconcile's snapshot and its status write; no pod
    # posts again, so were `dirty` cleared for it, the final counts would never reach status.
    r, kube, clock = running_reconciler([pod(0), pod(1)])
    r.on_report("ns", "cats", post(0, 1))
    snapshot = r.aggregator.snapshot

    def snapshot_then_a_post_lands(*args: Any, **kwargs: Any) -> Any:
        taken = snapshot(*args, **kwargs)
        r.aggregator.snapshot = snapshot  # type: ignore[method-assign]
        r.on_report("ns", "cats", post(0, 6))
        return taken

    r.aggregator.snapshot = snapshot_then_a_post_lands  # type: ignore[method-assign]
    r.reconcile(*KEY)
    assert [p["progress"]["completed"] for p in kube.patches] == [1]
    clock.now += 1.0
    r.reconcile(*KEY)
    assert [p["progress"]["completed"] for p in kube.patches] == [1, 6]


# -- the clock: a job is due only when something about it moves with time alone


def started(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def due_in(r: Reconciler) -> float | None:
    when = r.schedule.when(KEY)
    return None if when is None else when - time.monotonic()


def test_a_running_job_with_nothing_timed_is_not_in_the_queue_and_its_deadline_is() -> None:
    r, kube, _ = running_reconciler([pod(0), pod(1)])
    assert due_in(r) is None, "no deadline, no pod has stepped: the clock never looks at it"
    kube.body["spec"]["runPolicy"] = {"activeDeadlineSeconds": 100}
    kube.body["status"]["startTime"] = started(30)
    kube.body["metadata"]["resourceVersion"] = "100"
    assert r.seen(KEY, copy.deepcopy(kube.body))
    r.reconcile(*KEY)
    assert 68 < (due_in(r) or 0) < 71, "due when the deadline passes, 70 s from now"


def test_a_finished_job_is_due_only_for_its_ttl() -> None:
    r, kube, _ = running_reconciler([pod(0), pod(1)])
    r.indexes.remember({Index.JOBS: {KEY: [job_view(complete=True)]}}, listed=False)
    r.reconcile(*KEY)
    assert kube.body["status"]["phase"] == "Succeeded" and due_in(r) is None
    kube.body["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 60}
    kube.body["metadata"]["resourceVersion"] = "100"
    assert r.seen(KEY, copy.deepcopy(kube.body))
    r.reconcile(*KEY)
    assert 58 < (due_in(r) or 0) < 61, "due when its time to live ends"


def test_a_decision_can_ask_to_be_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    r, _, _ = running_reconciler([pod(0), pod(1)])
    decide = reconciler_module.decide

    def asking(*args: Any, **kwargs: Any) -> Decision:
        decision = decide(*args, **kwargs)
        decision.check_again_at = datetime.now(UTC) + timedelta(seconds=42)
        return decision

    monkeypatch.setattr(reconciler_module, "decide", asking)
    r.reconcile(*KEY)
    assert 40 < (due_in(r) or 0) < 43


def test_a_failed_reconcile_is_tried_again_with_growing_backoff() -> None:
    r, kube, clock = running_reconciler([pod(0), pod(1)])
    write = kube.patch_status

    def unavailable(*_args: Any) -> Any:
        raise OSError("the API server is away")

    kube.patch_status = unavailable  # type: ignore[method-assign]
    r.on_report("ns", "cats", post(0, 1))  # something to write
    for expected in (1.0, 2.0, 4.0):
        r.schedule.drop(KEY)
        with pytest.raises(OSError):
            r.reconcile(*KEY)
        assert due_in(r) == pytest.approx(expected, abs=0.2)
    # The body stays known meanwhile (the progress endpoint reads it), and is read again next time.
    assert KEY in r.bodies
    read = kube.get_diffusion_job
    reads: list[str] = []
    kube.get_diffusion_job = lambda ns, name: reads.append(name) or read(ns, name)  # type: ignore[method-assign]
    kube.patch_status = write  # type: ignore[method-assign]
    clock.now += 1.0
    r.reconcile(*KEY)
    assert kube.patches[-1]["progress"]["completed"] == 1 and r._failures == {} and reads == ["cats"]


class TwoJobs(FakeKube):
    """`cats`, and `hung`, whose status write waits until released (an API server that does not answer)."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.release = threading.Event()
        self.written: list[str] = []

    def get_diffusion_job(self, namespace: str, name: str) -> dict[str, Any]:
        body = copy.deepcopy(self.body)
        body["metadata"]["name"] = name
        return body

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        if name == "hung":
            self.release.wait(30)
        self.written.append(name)
        body = self.get_diffusion_job(namespace, name)
        body["status"] = status
        return body


def test_a_call_that_hangs_holds_one_clock_worker_not_the_clock() -> None:
    body = make_job("cats").prompts(*["p"] * 10).world(nodes=2).obj()
    body["metadata"].update(namespace="ns", generation=1, resourceVersion="1")
    kube = TwoJobs(body)
    r = Reconciler(kube, OperatorSettings())  # type: ignore[arg-type]
    r.indexes.remember({Index.JOBS: {("ns", n): [job_view()] for n in ("hung", "cats")}})  # listed
    stop = threading.Event()
    ticking = ClockThread(r)
    clock = threading.Thread(target=ticking.run, args=(stop,), daemon=True)
    clock.start()
    try:
        r.schedule.at(("ns", "hung"), 0.0)
        wait_for(lambda: kube.written == [] and ticking._clocking, timeout=5, message="hung's write under way")
        r.schedule.at(("ns", "cats"), 0.0)
        wait_for(lambda: kube.written == ["cats"], timeout=5, message="cats reconciled while hung's write hangs")
        kube.release.set()
        wait_for(lambda: sorted(kube.written) == ["cats", "hung"], timeout=5, message="hung's write done")
    finally:
        kube.release.set()
        stop.set()
        r.wake.set()
        clock.join(5)
    assert not clock.is_alive()


def test_a_job_whose_posts_stopped_is_woken_by_the_next_post() -> None:
    r, kube, _ = running_reconciler([pod(0), pod(1)])
    kube.body["spec"]["runPolicy"] = {"stallTimeoutSeconds": 10}
    kube.body["metadata"]["resourceVersion"] = "100"
    assert r.seen(KEY, copy.deepcopy(kube.body))
    r.aggregator._wall = lambda: datetime.now(UTC) - timedelta(seconds=60)  # type: ignore[method-assign]
    r.on_report("ns", "cats", post(0, 1))  # accepted a minute ago; nothing since
    r.reconcile(*KEY)
    unreachable = [c for c in kube.body["status"]["conditions"] if c["type"] == "ProgressUnreachable"]
    assert [c["status"] for c in unreachable] == ["True"] and "ProgressUnreachable" in kube.events
    assert kube.stopped == [] and KEY in r.awaiting_post and due_in(r) is None, "nothing to time until a post arrives"
    r.aggregator._wall = lambda: datetime.now(UTC)  # type: ignore[method-assign]
    r.on_report("ns", "cats", post(0, 1))  # the same counts: only the silence is news
    assert due_in(r) is not None and (due_in(r) or 0) <= 0
    r.reconcile(*KEY)
    cleared = [c for c in kube.body["status"]["conditions"] if c["type"] == "ProgressUnreachable"]
    assert [c["status"] for c in cleared] == ["False"] and "ProgressReceived" in kube.events


# -- kopf's side: the indexes by one name, the reconciler from kopf's memo


def test_every_index_kopf_keeps_is_one_the_reconciler_reads_by_the_same_name() -> None:
    """kopf hands each index to the handlers under its handler's id; the reconciler reads it by
    indexes.Index. A name on one side only would read as an empty index, never as an error."""
    registered = [h.id for h in kopf.get_default_registry()._indexing.get_all_handlers()
                  if h.fn.__module__ == handlers.__name__]
    assert sorted(registered) == sorted(Index)


def test_a_handler_reconciles_with_the_reconciler_in_kopfs_memo() -> None:
    r, kube, _ = running_reconciler([pod(0), pod(1)])
    r.forget(KEY)
    jobs = {KEY: [job_view()]}
    handlers.diffusion_job_event(namespace="ns", name="cats", type="MODIFIED", body=copy.deepcopy(kube.body),
                                 memo=kopf.Memo(reconciler=r), muralist_jobs=jobs)
    assert r.indexes.stores[Index.JOBS] is jobs and r.listed
    assert KEY in r.known and KEY in r.bodies, "reconciled"
    with pytest.raises(RuntimeError, match="memo holds no Reconciler"):
        handlers.pod_event(namespace="ns", body={"metadata": {"labels": {LABEL_JOB: "cats"}}}, memo=kopf.Memo())
