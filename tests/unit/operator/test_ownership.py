"""The reconciler against a fake API: children count only when the job owns them (by uid), a
name taken by a stranger fails the job by that name, what is gone is created again, and the
events of a pod that does not start are read when its status cannot say why."""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from muralist_operator.decision import iso
from muralist_operator.indexes import CHILD_INDEXES, Index
from muralist_operator.kube import Kube, NameHeld, NameTaken
from muralist_operator.observe import ChildView, ContainerExit, PodView, WarningEvent
from muralist_operator.progress.aggregate import Aggregator
from muralist_operator.reconciler import Reconciler
from muralist_operator.settings import OperatorSettings

from tests.builders import make_job
from tests.views import job_view, pod

KEY = ("ns", "cats")
DJ_UID, JOB_UID = "dj-uid", "job-uid"


class FakeKube:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.held: set[tuple[str, str]] = set()  # names an earlier job's objects still hold
        self.created: list[tuple[str, str]] = []
        self.events: list[str] = []
        self.deleted: list[str] = []
        self.taken: dict[tuple[str, str], dict[str, Any]] = {}  # (kind, name) -> a stranger's object
        self.warnings: dict[str, WarningEvent] = {}
        self.warning_reads: list[str] = []

    def get_diffusion_job(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.body)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.body["status"] = status
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.body)

    def create(self, obj: dict[str, Any], owner: dict[str, Any]) -> bool:
        name = (obj["kind"], obj["metadata"]["name"])
        if name in self.held:
            raise NameHeld(*name)
        if name in self.taken:
            raise NameTaken(*name, self.taken[name])
        self.created.append(name)
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        self.deleted.append(name)

    def post_event(self, owner: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append(reason)

    def latest_warning(self, namespace: str, uid: str) -> WarningEvent | None:
        self.warning_reads.append(uid)
        return self.warnings.get(uid)


def reconciler(pods: list[PodView], jobs: list[Any] | None = None, nodes: int = 2,
               children: list[ChildView] | None = None) -> tuple[Reconciler, FakeKube]:
    body = make_job("cats").world(nodes=nodes).obj()
    body["metadata"].update(namespace="ns", uid=DJ_UID, generation=1, resourceVersion="1")
    kube = FakeKube(body)
    r = Reconciler(kube, OperatorSettings(), Aggregator())  # type: ignore[arg-type]
    stores: dict[Index, dict[Any, list[Any]]] = {Index.JOBS: {KEY: jobs if jobs is not None else [ours()]},
                                                 Index.PODS: {KEY: pods}}
    if children is not None:
        by_kind = {"Service": Index.SERVICES, "ConfigMap": Index.CONFIG_MAPS, "NetworkPolicy": Index.NETWORK_POLICIES}
        stores.update({index: {} for index in CHILD_INDEXES})
        for child in children:
            stores[by_kind[child.kind]].setdefault(KEY, []).append(child)
    r.indexes.remember(stores, listed=False)
    return r, kube


def ours(**fields: Any) -> Any:
    return job_view(uid=JOB_UID, owner_uid=DJ_UID, **fields)


def worker(index: int, phase: str = "Running", **fields: Any) -> PodView:
    return pod(index, phase, owner_uid=JOB_UID, **fields)


ALL_CHILDREN = [ChildView("ConfigMap", "cats-spec", DJ_UID), ChildView("Service", "cats", DJ_UID),
                ChildView("NetworkPolicy", "cats", DJ_UID)]


def test_only_the_pods_of_the_jobs_own_job_count() -> None:
    doom = ContainerExit(78, "Error", '{"permanent": true, "message": "spec.model: no such model"}')
    strangers = [
        # Labelled as the job's pods, owned by another Job, by nothing, or ours without a completion index.
        pod(0, "Failed", term=doom, name="cats-0-forged", uid="f1", owner_uid="someone-elses-job"),
        pod(0, "Failed", term=doom, name="cats-bare", uid="f2"),
        worker(-1, "Failed", term=doom, name="cats-noindex", uid="f3"),
    ]
    r, kube = reconciler([worker(0), worker(1), *strangers])
    r.reconcile(*KEY)
    assert kube.body["status"]["phase"] == "Running" and kube.body["status"]["restarts"] == 0
    assert {p.name for p in r.observe(KEY, None).pods} == set(), "without the job's uid, no Job is its"


def test_a_job_the_diffusionjob_does_not_own_is_not_its_job() -> None:
    r, kube = reconciler([worker(0), worker(1)], jobs=[job_view(uid=JOB_UID, owner_uid="another-dj",
                                                                complete=True)])
    r.reconcile(*KEY)
    assert kube.body["status"]["phase"] == "Pending" and ("Job", "cats") in kube.created


def test_a_name_taken_by_a_stranger_fails_the_job_naming_it() -> None:
    r, kube = reconciler([], jobs=[])
    kube.taken[("ConfigMap", "cats-spec")] = {"metadata": {"name": "cats-spec"}}
    r.reconcile(*KEY)
    status = kube.body["status"]
    assert status["phase"] == "Failed"
    assert [c["reason"] for c in status["conditions"] if c["type"] == "Failed"] == ["NameTaken"]
    assert status["message"] == ("ConfigMap cats-spec already exists and is not this DiffusionJob's (nothing owns it): "
                                 "delete it, or create the DiffusionJob under another name")
    assert ("Job", "cats") not in kube.created and kube.deleted == []
    assert "NameTaken" in kube.events and "JobCreated" not in kube.events


def test_a_name_an_earlier_job_of_the_same_name_still_holds_is_waited_for() -> None:
    # `kubectl delete dj cats && kubectl apply -f cats.yaml`: the garbage collector has not deleted
    # the first cats' spec ConfigMap yet. Its pods must never read that one: no Job until it is gone.
    r, kube = reconciler([], jobs=[])
    kube.held.add(("ConfigMap", "cats-spec"))
    r.reconcile(*KEY)
    status = kube.body["status"]
    assert status["phase"] == "Pending" and ("Job", "cats") not in kube.created
    assert status["message"] == "waiting for ConfigMap cats-spec of an earlier DiffusionJob of this name to be deleted"
    assert "JobCreated" not in kube.events and KEY not in r.creator.created, "the next event creates it, grace or not"
    kube.held.clear()  # gone: its deletion is an event
    kube.body["metadata"]["resourceVersion"] = "50"
    assert r.seen(KEY, copy.deepcopy(kube.body))
    r.reconcile(*KEY)
    assert ("Job", "cats") in kube.created and "JobCreated" in kube.events


def test_a_name_taken_while_running_stops_the_jobs_pods() -> None:
    # Someone replaced the job's spec ConfigMap with their own: its pods would read the stranger's spec.
    owner = {"metadata": {"name": "cats-spec", "ownerReferences": [
        {"kind": "DiffusionJob", "name": "dogs", "uid": "x", "controller": True}]}}
    r, kube = reconciler([worker(0), worker(1)], children=ALL_CHILDREN[1:])
    kube.taken[("ConfigMap", "cats-spec")] = owner
    r.reconcile(*KEY)
    assert kube.body["status"]["phase"] == "Failed" and kube.deleted == ["cats"]
    assert "(it belongs to DiffusionJob dogs)" in kube.body["status"]["message"]


def test_a_deleted_child_is_created_again_once_the_indexes_had_time() -> None:
    r, kube = reconciler([worker(0), worker(1)], children=ALL_CHILDREN[:2])
    r.creator.created[KEY] = 0.0  # created long ago
    r.reconcile(*KEY)
    assert kube.created == [("NetworkPolicy", "cats")] and kube.events.count("ChildRestored") == 1
    # Right after a creation the index may not show it yet: not created twice.
    kube.body["metadata"]["resourceVersion"] = "50"
    assert r.seen(KEY, copy.deepcopy(kube.body))
    r.reconcile(*KEY)
    assert kube.created == [("NetworkPolicy", "cats")] and kube.events.count("ChildRestored") == 1
    # A child of the same kind and name that another job owns is not the job's.
    stranger = ChildView("NetworkPolicy", "cats", "another-dj")
    r2, kube2 = reconciler([worker(0), worker(1)], children=[*ALL_CHILDREN[:2], stranger])
    r2.reconcile(*KEY)
    assert kube2.created == [("NetworkPolicy", "cats")]


def test_a_slow_pods_events_are_read_once_its_status_cannot_say_why() -> None:
    now = datetime.now(UTC)
    mounting = worker(1, "Pending", scheduled=True, created=iso(now - timedelta(seconds=45)))
    r, kube = reconciler([worker(0), mounting])
    kube.warnings["uid-1-0"] = WarningEvent("FailedMount", 'configmap "prompt-list" not found', now)
    r.reconcile(*KEY)
    assert kube.warning_reads == ["uid-1-0"]
    waiting = next(c for c in kube.body["status"]["conditions"] if c["type"] == "PodsNotStarting")
    assert (waiting["reason"], waiting["message"]) == (
        "FailedMount", 'index 1 (pod cats-1-0): FailedMount: configmap "prompt-list" not found')
    kube.body["metadata"]["resourceVersion"] = "50"
    assert r.seen(KEY, copy.deepcopy(kube.body))
    r.reconcile(*KEY)
    assert kube.warning_reads == ["uid-1-0"], "read again only after a while"
    # A pod that says why itself costs no read.
    pulling = worker(1, "Pending", waiting_reason="ErrImagePull", created=iso(now - timedelta(seconds=45)))
    r2, kube2 = reconciler([worker(0), pulling])
    r2.reconcile(*KEY)
    assert kube2.warning_reads == []


def test_the_progress_endpoint_hears_only_pods_of_the_job_it_owns() -> None:
    r, _ = reconciler([], jobs=[job_view(uid="theirs", owner_uid="another-dj"), ours()])
    assert r.workers_uid(*KEY) is None, "the job's body is not known yet"
    r.reconcile(*KEY)
    assert r.workers_uid(*KEY) == JOB_UID
    r.indexes.remember({Index.JOBS: {KEY: [job_view(uid="theirs", owner_uid="another-dj")]}})
    assert r.workers_uid(*KEY) is None


# -- Kube.create: a 409 reads the object that is there


class Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()

    def read(self) -> bytes:
        return self.data

    def release_conn(self) -> None:
        pass


class Taken:
    """The client's create and read calls of every kind of child, the name taken by `existing`
    (None: free)."""

    def __init__(self, existing: dict[str, Any] | None) -> None:
        self.existing = existing

    def create(self, namespace: str, body: dict[str, Any], **_: Any) -> Response:
        if self.existing is None:
            return Response(body)
        raise ApiException(status=409, reason="Conflict")

    def read(self, name: str, namespace: str, **_: Any) -> Response:
        if self.existing is None:
            raise ApiException(status=404, reason="Not Found")
        return Response(self.existing)

    create_namespaced_service = create_namespaced_config_map = create_namespaced_job = create
    create_namespaced_network_policy = create
    read_namespaced_service = read_namespaced_config_map = read_namespaced_job = read_namespaced_network_policy = read


OWNER = {"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob",
         "metadata": {"name": "cats", "namespace": "ns", "uid": DJ_UID}}


def spec_config_map() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cats-spec", "namespace": "ns"}}


def kube_with(existing: dict[str, Any] | None) -> Kube:
    api = Taken(existing)
    return Kube(core=api, batch=api, custom=None, authentication=None, networking=api)


def test_create_owns_what_it_makes_and_tells_whose_a_taken_name_is() -> None:
    made = spec_config_map()
    assert kube_with(None).create(made, OWNER) is True
    [ref] = made["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("DiffusionJob", DJ_UID, True)
    ours_already = {"metadata": {"name": "cats-spec", "ownerReferences": [dict(ref)]}}
    assert kube_with(ours_already).create(spec_config_map(), OWNER) is False, "a retry: it is the job's"
    earlier = {**ref, "uid": "the-first-cats"}
    for going in ({"metadata": {"name": "cats-spec", "ownerReferences": [earlier]}},
                  {"metadata": {"name": "cats-spec", "deletionTimestamp": "2026-12-05T00:00:00Z",
                                "ownerReferences": [{**ref, "name": "dogs", "uid": "x"}]}}):
        with pytest.raises(NameHeld):  # the earlier cats' (deleted), or one being deleted: wait for it
            kube_with(going).create(spec_config_map(), OWNER)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"metadata": {"name": "cats-spec"}}, "nothing owns it"),
        ({"metadata": {"name": "cats-spec", "ownerReferences": [{**ref, "name": "dogs", "uid": "x"}]}},
         "it belongs to DiffusionJob dogs"),
        # A reference to the job that is no controller's (anyone may add one) does not make it the job's.
        ({"metadata": {"name": "cats-spec", "ownerReferences": [{**ref, "controller": False}]}}, "nothing owns it"),
    ]
    for existing, whose in cases:
        with pytest.raises(NameTaken) as taken:
            kube_with(existing).create(spec_config_map(), OWNER)
        assert str(taken.value) == (f"ConfigMap cats-spec already exists and is not this DiffusionJob's ({whose}): "
                                    "delete it, or create the DiffusionJob under another name")


def test_a_pods_start_clock_begins_when_its_gate_is_lifted() -> None:
    # Kueue's workload slices: a pod waits behind its gate (for admission, maybe for hours), then
    # must start. Created long ago, its clock starts when the operator sees the gate gone.
    long_ago = iso(datetime.now(UTC) - timedelta(seconds=3600))
    gated = worker(1, "Pending", gated=True, created=long_ago, waiting_reason="Unschedulable")
    r, kube = reconciler([worker(0), gated])
    kube.body["spec"]["runPolicy"] = {"startTimeoutSeconds": 60}
    r.reconcile(*KEY)
    assert "PodsNotStarting" not in [c["type"] for c in kube.body["status"]["conditions"]], "gated: not waiting"
    lifted = worker(1, "Pending", created=long_ago, waiting_reason="Unschedulable")
    r.indexes.remember({Index.PODS: {KEY: [worker(0), lifted]}})
    kube.body["metadata"]["resourceVersion"] = "50"
    assert r.seen(KEY, copy.deepcopy(kube.body))
    r.reconcile(*KEY)
    assert kube.body["status"]["phase"] == "Pending", "an hour old, but its clock started just now"
    assert "uid-1-0" in r.observer.start_clocks[KEY]
    waiting = next(c for c in kube.body["status"]["conditions"] if c["type"] == "PodsNotStarting")
    assert waiting["reason"] == "Unschedulable"
    # An operator started after the gate was lifted knows it from the pod's generation (its spec
    # changed since its creation): the clock starts when it first sees the pod.
    fresh, kube2 = reconciler([worker(0), dataclasses.replace(lifted, generation=2)])
    kube2.body["spec"]["runPolicy"] = {"startTimeoutSeconds": 60}
    fresh.reconcile(*KEY)
    assert kube2.body["status"]["phase"] == "Pending"
    # A pod whose spec never changed counts from its creation.
    plain, kube3 = reconciler([worker(0), lifted])
    kube3.body["spec"]["runPolicy"] = {"startTimeoutSeconds": 60}
    plain.reconcile(*KEY)
    assert kube3.body["status"]["phase"] == "Failed"


class GoneBetween(Taken):
    """The name is taken when the create is tried, and free again when the object is read: an earlier
    job's ConfigMap collected between the two calls."""

    def __init__(self) -> None:
        super().__init__({"metadata": {"name": "cats-spec"}})
        self.creates = 0

    def create(self, namespace: str, body: dict[str, Any], **_: Any) -> Response:
        self.creates += 1
        if self.creates == 1:
            raise ApiException(status=409, reason="Conflict")
        return Response(body)

    def read(self, name: str, namespace: str, **_: Any) -> Response:
        raise ApiException(status=404, reason="Not Found")

    create_namespaced_config_map = create
    read_namespaced_config_map = read


def test_a_name_freed_between_the_create_and_the_read_is_created_then() -> None:
    # Never "exists" for a child that is not there: the Job would be created next, its pods without their spec.
    api = GoneBetween()
    kube = Kube(core=api, batch=api, custom=None, authentication=None, networking=api)  # type: ignore[arg-type]
    assert kube.create(spec_config_map(), OWNER) is True and api.creates == 2
