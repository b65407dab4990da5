"""Queued DiffusionJobs under Kueue's real manager (tests/kueue_plugin.py): admission, preemption.

kwok plays the pods (tests/kube_helpers.py set_pod_fate decides how they end); the two fake nodes
have 8 GPUs each (hack/controlplane.py), and the ClusterQueue's GPU quota is exactly those 16.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from muralist_api import job as job_api

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for
from tests.kueue_plugin import GROUP, VERSION, Kueue
from tests.operator_helpers import DJ

pytestmark = pytest.mark.cluster

FLAVOR = "kwok-gpu"
CLUSTER_QUEUE = "gpus"
LOCAL_QUEUE = "gpu-batch"
NODE_GPUS = 16
LOW, HIGH = "muralist-test-low", "muralist-test-high"


def quota(flavor: str) -> list[dict[str, Any]]:
    """A ClusterQueue's resource groups: the kwok nodes' GPUs, and CPU and memory to spare."""
    return [{
        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
        "flavors": [{"name": flavor, "resources": [
            {"name": "cpu", "nominalQuota": "64"},
            {"name": "memory", "nominalQuota": "512Gi"},
            {"name": "nvidia.com/gpu", "nominalQuota": str(NODE_GPUS)},
        ]}],
    }]


def wait_active(custom: Any, cluster_queue: str) -> None:
    """Until Kueue says the ClusterQueue can admit (its flavors and quotas are known)."""
    def active() -> bool:
        got = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", cluster_queue)
        return any(c["type"] == "Active" and c["status"] == "True" for c in got.get("status", {}).get("conditions", []))

    wait_for(active, timeout=60, message=f"ClusterQueue {cluster_queue} active")


@pytest.fixture(autouse=True)
def kueue_lives(kueue: Kueue) -> Iterator[None]:
    """A manager that died mid-test shows as timeouts: say so."""
    yield
    kueue.alive()


def create_local_queue(dj: DJ) -> None:
    dj.custom.create_namespaced_custom_object(
        GROUP, VERSION, dj.ns, "localqueues",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
         "metadata": {"name": LOCAL_QUEUE}, "spec": {"clusterQueue": CLUSTER_QUEUE}},
    )


@pytest.fixture(scope="module")
def cluster_queue(kueue: Kueue, kube_api: Any) -> Iterator[str]:
    """One flavor for the kwok nodes, a ClusterQueue with their GPUs as quota, two priorities."""
    custom = client.CustomObjectsApi(kube_api)
    scheduling = client.SchedulingV1Api(kube_api)
    custom.create_cluster_custom_object(
        GROUP, VERSION, "resourceflavors",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
         "spec": {"nodeLabels": {"type": "kwok"}}},
    )
    custom.create_cluster_custom_object(
        GROUP, VERSION, "clusterqueues",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": quota(FLAVOR),
            },
        },
    )
    for name, value in ((LOW, 100), (HIGH, 1000)):
        scheduling.create_priority_class({"metadata": {"name": name}, "value": value})

    wait_active(custom, CLUSTER_QUEUE)
    try:
        yield CLUSTER_QUEUE
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "clusterqueues", CLUSTER_QUEUE)
        custom.delete_cluster_custom_object(GROUP, VERSION, "resourceflavors", FLAVOR)
        for name in (LOW, HIGH):
            scheduling.delete_priority_class(name)


def workload(dj: DJ, job_name: str) -> dict[str, Any]:
    """The Workload Kueue made for the DiffusionJob's Job (owned by the Job); {} while there is none."""
    items = dj.custom.list_namespaced_custom_object(GROUP, VERSION, dj.ns, "workloads")["items"]
    return next((w for w in items if any(o["kind"] == "Job" and o["name"] == job_name
                                         for o in w["metadata"].get("ownerReferences", []))), {})


def admitted_workload(dj: DJ, job_name: str) -> dict[str, Any]:
    def admitted() -> dict[str, Any]:
        found = workload(dj, job_name)
        return found if condition(found, "Admitted") else {}

    return wait_for(admitted, timeout=60, message=f"Kueue to admit the Workload of Job {job_name}")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """The object's condition `kind` if it is True; {} otherwise."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind and c["status"] == "True"), {})


def job_suspended(dj: DJ, name: str) -> bool:
    return bool(dj.batch.read_namespaced_job(name, dj.ns).spec.suspend)


def queued(name: str, nodes: int, gpus: int, **template: Any) -> Any:
    return (make_job(name).world(nodes=nodes, gpus=gpus).run_policy(queueName=LOCAL_QUEUE)
            .pod_template(annotations=fate_annotations("run"), **template))


def finish(dj: DJ, name: str, count: int) -> dict[str, Any]:
    for pod in dj.wait_pods(name, count):
        set_pod_fate(dj.core, pod.metadata.name, dj.ns, "succeed", after="100ms")
    return dj.wait_phase(name, "Succeeded")


def test_a_queued_job_waits_for_admission_then_runs_to_the_end(dj: DJ, cluster_queue: str) -> None:
    # No LocalQueue yet: Kueue makes the Workload but cannot admit it.
    dj.create(queued("cats", nodes=2, gpus=8).obj())
    pending = wait_for(lambda: workload(dj, "cats"), message="the Workload of Job cats")
    assert pending["spec"]["queueName"] == LOCAL_QUEUE
    assert pending["spec"]["podSets"][0]["count"] == 2
    assert not condition(pending, "QuotaReserved") and not condition(pending, "Admitted")
    waiting = dj.wait_phase("cats", "Suspended")
    assert waiting["message"] == f"waiting for Kueue to admit it from queue {LOCAL_QUEUE}"
    assert job_suspended(dj, "cats") and not dj.pods("cats")

    create_local_queue(dj)
    admitted = admitted_workload(dj, "cats")
    assignment = admitted["status"]["admission"]["podSetAssignments"][0]
    assert assignment["flavors"]["nvidia.com/gpu"] == FLAVOR and assignment["count"] == 2
    # Admitted first, then Kueue's Job reconciler unsuspends the Job.
    wait_for(lambda: not job_suspended(dj, "cats"), message="Kueue to unsuspend Job cats")
    pods = dj.wait_pods("cats", 2)
    # Kueue starts the Job with its flavor's node labels in the pod template.
    assert all((p.spec.node_selector or {}).get("type") == "kwok" for p in pods)
    dj.wait_phase("cats", "Running")

    done = finish(dj, "cats", 2)
    assert done["progress"]["summary"] == "2/2"
    wait_for(lambda: condition(workload(dj, "cats"), "Finished"), message="the Workload to finish")


def test_a_higher_priority_job_preempts_a_running_one(dj: DJ, cluster_queue: str) -> None:
    create_local_queue(dj)
    dj.create(queued("low", nodes=2, gpus=8, priorityClassName=LOW).obj())
    low_pods = dj.wait_pods("low", 2)
    dj.wait_phase("low", "Running")
    low_job = dj.batch.read_namespaced_job("low", dj.ns)
    assert admitted_workload(dj, "low")["spec"]["priority"] == 100

    # The low job holds all 16 GPUs of the quota; the high one needs 8 of them.
    dj.create(queued("high", nodes=1, gpus=8, priorityClassName=HIGH).obj())
    evicted = wait_for(lambda: condition(workload(dj, "low"), "Evicted"), timeout=60,
                       message="Kueue to evict the low job's Workload")
    assert evicted["reason"] == "Preempted"
    wait_for(lambda: job_suspended(dj, "low"), message="the low job's Job suspended by Kueue")
    wait_for(lambda: not dj.pods("low"), timeout=60, message="the low job's pods gone")
    low = dj.wait_phase("low", "Suspended")
    assert low["message"] == f"waiting for Kueue to admit it from queue {LOCAL_QUEUE}"
    # Preemption suspends: the Job, its Service and spec ConfigMap stay (same objects).
    assert dj.batch.read_namespaced_job("low", dj.ns).metadata.uid == low_job.metadata.uid
    assert dj.core.read_namespaced_service("low", dj.ns) and dj.core.read_namespaced_config_map("low-spec", dj.ns)

    high_pods = dj.wait_pods("high", 1)
    assert high_pods[0].spec.priority == 1000
    dj.wait_phase("high", "Running")
    # 8 GPUs are free while the high job runs, but the low one needs 16: it waits.
    assert job_suspended(dj, "low")
    finish(dj, "high", 1)

    # Re-admitted once the quota is back: new pods for both indexes, run to the end.
    wait_for(lambda: not job_suspended(dj, "low"), timeout=60, message="the low job re-admitted")
    again = dj.wait_pods("low", 2)
    assert not {p.metadata.uid for p in again} & {p.metadata.uid for p in low_pods}
    done = finish(dj, "low", 2)
    assert done["progress"]["summary"] == "2/2"
    # The pods the suspension deleted count as no failure of their indexes.
    assert done.get("restarts", 0) == 0 and not done.get("indexes")
    assert dj.batch.read_namespaced_job("low", dj.ns).metadata.uid == low_job.metadata.uid


def scale(dj: DJ, name: str, nodes: int) -> None:
    """What `kubectl scale dj/NAME --replicas=N` does: a write to the scale subresource."""
    dj.custom.patch_namespaced_custom_object_scale(job_api.GROUP, job_api.VERSION, dj.ns, job_api.PLURAL, name,
                                                   {"spec": {"replicas": nodes}})


def test_resizing_an_admitted_job_queues_it_again_at_its_new_size(dj: DJ, cluster_queue: str) -> None:
    """Without runPolicy.workloadSlices, a Workload's pod count is fixed:
    Kueue suspends a Job whose size no longer matches its Workload (the pods drain), replaces the
    Workload and admits the job again at the new size when the quota allows it."""
    create_local_queue(dj)
    dj.create(queued("cats", nodes=2, gpus=4).obj())
    first_pods = dj.wait_pods("cats", 2)
    assert admitted_workload(dj, "cats")["spec"]["podSets"][0]["count"] == 2

    # 5 pods of 4 GPUs: more than the 16 the ClusterQueue has. The job waits in the queue.
    scale(dj, "cats", 5)
    wait_for(lambda: job_suspended(dj, "cats"), message="Kueue to suspend the resized Job")
    wait_for(lambda: not dj.pods("cats"), timeout=60, message="the pods of the old size gone")
    wait_for(lambda: workload(dj, "cats").get("spec", {}).get("podSets", [{}])[0].get("count") == 5,
             message="a Workload for 5 pods")
    waiting = dj.wait_phase("cats", "Suspended")
    assert waiting["message"] == f"waiting for Kueue to admit it from queue {LOCAL_QUEUE}"
    assert not condition(workload(dj, "cats"), "QuotaReserved")

    # 3 pods fit: admitted at that size, new pods for every index.
    scale(dj, "cats", 3)
    assert admitted_workload(dj, "cats")["status"]["admission"]["podSetAssignments"][0]["count"] == 3
    wait_for(lambda: not job_suspended(dj, "cats"), timeout=60, message="the job admitted again at 3 pods")
    again = dj.wait_pods("cats", 3)
    assert not {p.metadata.uid for p in again} & {p.metadata.uid for p in first_pods}
    running = wait_for(lambda: (s := dj.status("cats")).get("nodes") == 3 and s.get("phase") == "Running" and s,
                       timeout=60, message="status: 3 pods running")
    assert running.get("restarts", 0) == 0
    done = finish(dj, "cats", 3)
    # Neither the suspension nor the resize counts as a failure of any index.
    assert done.get("restarts", 0) == 0 and not done.get("indexes")


def slices(dj: DJ, job_name: str) -> list[dict[str, Any]]:
    """Every Workload of the Job (one per slice), oldest first."""
    items = dj.custom.list_namespaced_custom_object(GROUP, VERSION, dj.ns, "workloads")["items"]
    owned = [w for w in items if any(o["kind"] == "Job" and o["name"] == job_name
                                     for o in w["metadata"].get("ownerReferences", []))]
    return sorted(owned, key=lambda w: w["metadata"]["creationTimestamp"])


def admitted_slice(dj: DJ, job_name: str, count: int) -> dict[str, Any]:
    """The one unfinished slice, admitted for `count` pods; the slices before it finished."""
    def only_admitted() -> dict[str, Any]:
        found = slices(dj, job_name)
        live = [w for w in found if not condition(w, "Finished")]
        if len(live) == 1 and condition(live[0], "Admitted") and live[0]["spec"]["podSets"][0]["count"] == count:
            return live[0]
        return {}

    return wait_for(only_admitted, timeout=60, message=f"Kueue to admit a slice of {count} pods for Job {job_name}")


def running_uids(dj: DJ, name: str) -> dict[int, str]:
    return {int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]): p.metadata.uid
            for p in dj.pods(name) if p.status.phase == "Running"}


def test_workload_slices_resize_a_running_job_without_stopping_it(dj: DJ, cluster_queue: str) -> None:
    """runPolicy.workloadSlices: a grow within the quota is admitted as a new Workload slice that
    replaces the old one, the running pods untouched; a grow past the quota waits as a slice of
    its own while the job goes on at its admitted size, the new pod held by Kueue's scheduling
    gate; a shrink back within the quota is admitted at once. The Job is never suspended."""
    create_local_queue(dj)
    dj.create(queued("cats", nodes=2, gpus=4).run_policy(workloadSlices=True).obj())
    job = wait_for(lambda: dj.batch.read_namespaced_job("cats", dj.ns), message="Job cats")
    assert job.metadata.annotations["kueue.x-k8s.io/elastic-job"] == "true"
    assert [g.name for g in job.spec.template.spec.scheduling_gates] == ["kueue.x-k8s.io/elastic-job"]
    first = admitted_slice(dj, "cats", 2)
    pods = dj.wait_pods("cats", 2)
    # Admitted: Kueue lifted the gate of each pod it counts.
    assert not any(p.spec.scheduling_gates for p in pods)
    dj.wait_phase("cats", "Running")
    before = running_uids(dj, "cats")

    # 4 pods of 4 GPUs: the whole quota. A new slice replaces the admitted one.
    scale(dj, "cats", 4)
    grown = admitted_slice(dj, "cats", 4)
    assert grown["metadata"]["name"] != first["metadata"]["name"]
    assert condition(next(w for w in slices(dj, "cats") if w["metadata"]["name"] == first["metadata"]["name"]),
                     "Finished")
    dj.wait_pods("cats", 4)
    assert not job_suspended(dj, "cats")
    four = running_uids(dj, "cats")
    assert {i: four[i] for i in before} == before, "the pods of the first slice kept running"

    # 5 pods: past the quota. The new slice waits; the four admitted pods go on, the fifth is gated.
    scale(dj, "cats", 5)
    fifth = wait_for(lambda: [p for p in dj.pods("cats", index=4) if p.spec.scheduling_gates],
                     message="the fifth pod, held by Kueue's gate")[0]
    assert fifth.status.phase == "Pending"
    pending = wait_for(lambda: [w for w in slices(dj, "cats") if w["spec"]["podSets"][0]["count"] == 5],
                       message="a Workload slice for 5 pods")[0]
    assert not condition(pending, "QuotaReserved")
    waiting = wait_for(lambda: "wait for Kueue" in (s := dj.status("cats")).get("message", "") and s,
                       message="status: the fifth pod waits for Kueue")
    assert waiting["phase"] == "Running"
    assert f"1 pod(s) wait for Kueue to admit 5 pod(s) from queue {LOCAL_QUEUE} (4 running)" in waiting["message"]
    assert running_uids(dj, "cats") == four and not job_suspended(dj, "cats")

    # Back to 3: the waiting slice is resized and admitted; indexes 3 and 4 drain.
    scale(dj, "cats", 3)
    admitted_slice(dj, "cats", 3)
    wait_for(lambda: len(dj.pods("cats")) == 3, timeout=60, message="indexes 3 and 4 gone")
    assert running_uids(dj, "cats") == {i: four[i] for i in range(3)}
    assert not job_suspended(dj, "cats")
    done = finish(dj, "cats", 3)
    assert done.get("restarts", 0) == 0 and not done.get("indexes")


TAS_FLAVOR, TAS_CLUSTER_QUEUE, TAS_LOCAL_QUEUE, TOPOLOGY = "kwok-hosts", "gpus-by-host", "by-host", "hosts"
HOSTNAME = "kubernetes.io/hostname"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"


@pytest.fixture(scope="module")
def tas_cluster_queue(kueue: Kueue, kube_api: Any) -> Iterator[str]:
    """Topology-aware scheduling over the kwok nodes: one topology level, the host."""
    custom = client.CustomObjectsApi(kube_api)
    custom.create_cluster_custom_object(
        GROUP, VERSION, "topologies",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Topology", "metadata": {"name": TOPOLOGY},
         "spec": {"levels": [{"nodeLabel": HOSTNAME}]}},
    )
    custom.create_cluster_custom_object(
        GROUP, VERSION, "resourceflavors",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": TAS_FLAVOR},
         "spec": {"nodeLabels": {"type": "kwok"}, "topologyName": TOPOLOGY}},
    )
    custom.create_cluster_custom_object(
        GROUP, VERSION, "clusterqueues",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": TAS_CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": quota(TAS_FLAVOR),
            },
        },
    )

    wait_active(custom, TAS_CLUSTER_QUEUE)
    try:
        yield TAS_CLUSTER_QUEUE
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "clusterqueues", TAS_CLUSTER_QUEUE)
        custom.delete_cluster_custom_object(GROUP, VERSION, "resourceflavors", TAS_FLAVOR)
        custom.delete_cluster_custom_object(GROUP, VERSION, "topologies", TOPOLOGY)


def test_required_topology_reaches_the_pods_and_places_them(dj: DJ, tas_cluster_queue: str) -> None:
    dj.custom.create_namespaced_custom_object(
        GROUP, VERSION, dj.ns, "localqueues",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
         "metadata": {"name": TAS_LOCAL_QUEUE}, "spec": {"clusterQueue": tas_cluster_queue}},
    )
    # Two pods of 4 GPUs that must share one host (a kwok node has 8).
    dj.create(
        make_job("cats").world(nodes=2, gpus=4).run_policy(queueName=TAS_LOCAL_QUEUE)
        .pod_template(annotations={**fate_annotations("run"), REQUIRED_TOPOLOGY: HOSTNAME}).obj()
    )
    admitted = admitted_workload(dj, "cats")
    assert admitted["spec"]["podSets"][0]["topologyRequest"]["required"] == HOSTNAME
    assert admitted["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    pods = dj.wait_pods("cats", 2)
    assert all(p.metadata.annotations[REQUIRED_TOPOLOGY] == HOSTNAME for p in pods)
    # Kueue's topology ungater placed both on the one host it assigned.
    assert len({p.spec.node_name for p in pods}) == 1
    assert {(p.spec.node_selector or {}).get(HOSTNAME) for p in pods} == {pods[0].spec.node_name}
    assert finish(dj, "cats", 2)["progress"]["summary"] == "2/2"
