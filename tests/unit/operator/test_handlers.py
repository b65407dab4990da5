"""The reconciler: a job whose children cannot be rendered fails with the reason; what it writes
from pushed progress, and when."""

from __future__ import annotations

import copy
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from muralist_api.contract import Counts
from muralist_api.contract.progress import ProgressReport
from muralist_api.status import DiffusionJobStatus
from muralist_operator import handlers
from muralist_operator import reconciler as reconciler_module
from muralist_operator.decision import CreateJob, Decision
from muralist_operator.observe import PodView
from muralist_operator.progress.aggregate import Aggregator
from muralist_operator.settings import OperatorSettings

from tests.builders import make_job
from tests.views import NOW, job_view, pod


def test_a_render_failure_becomes_a_permanent_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise KeyError("volumes")

    monkeypatch.setattr(reconciler_module, "render_children", broken)
    reconciler = handlers.Reconciler(kube=None, settings=OperatorSettings())  # type: ignore[arg-type]
    decision = Decision(DiffusionJobStatus(), actions=[CreateJob(None)])
    with pytest.raises(handlers.RenderFailure, match="cannot build this job's pods: 'volumes'"):
        reconciler._render(make_job().job(), ("ns", "cats"), decision)
    # Without a pod group to create, nothing is rendered.
    assert reconciler._render(make_job().job(), ("ns", "cats"), Decision(DiffusionJobStatus())) is None


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


def running_reconciler(pods: list[PodView]) -> tuple[handlers.Reconciler, FakeKube, Clock]:
    body = make_job("cats").prompts(*["p"] * 10).world(nodes=2).obj()
    body["metadata"].update(namespace="ns", generation=1, resourceVersion="1")
    kube = FakeKube(body)
    clock = Clock()
    r = handlers.Reconciler(kube, OperatorSettings(), Aggregator(clock=clock))  # type: ignore[arg-type]
    r.indexes = {"muralist_jobs": {KEY: [job_view()]}, "muralist_pods": {KEY: pods}}
    r.reconcile(*KEY)
    assert kube.body["status"]["phase"] == "Running"
    kube.patches.clear()
    clock.now += 1.0  # that write counted for the throttle
    return r, kube, clock


KEY = ("ns", "cats")


def post(index: int, completed: int) -> ProgressReport:
    return ProgressReport(pod=f"cats-{index}-0", index=index, attempt=0, ranks=1, completed=completed, skipped=0,
                          failed=0, total=10, last_step_time=NOW, last_image_time=NOW, sent_at=NOW, final=False)


def test_counts_are_written_at_most_once_per_interval_and_the_rate_alone_never() -> None:
    r, kube, clock = running_reconciler([pod(0), pod(1)])
    r.on_report("ns", "cats", post(0, 1))
    assert r.wake.is_set()  # the job became due: the clock thread wakes
    r.reconcile(*KEY)
    assert [p["progress"]["completed"] for p in kube.patches] == [1]
    r.wake.clear()
    clock.now += 0.5
    r.on_report("ns", "cats", post(0, 3))
    assert r.wake.is_set()  # changed again: the clock thread sets its timer (due in 0.5 s)
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
    assert KEY not in r.stall_checks, "no pod has stepped: nothing to time"
    quiet = ProgressReport(pod="cats-1-0", index=1, attempt=0, ranks=1, completed=1, skipped=0, failed=0, total=10,
                           last_step_time=datetime.now(UTC) - timedelta(seconds=590), last_image_time=None,
                           sent_at=NOW, final=False)
    r.on_report("ns", "cats", quiet)
    r.reconcile(*KEY)
    assert kube.stopped == [] and KEY not in r.clocked
    assert 8 < r.stall_checks[KEY] - time.monotonic() < 12, "due when the default (600 s) has passed"
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
