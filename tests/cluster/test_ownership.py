"""Owned means owned, against the real API server: a job's children count only when the job
owns them (owner references by uid), a name a stranger holds fails the job by that name, and a
child someone deleted is created again."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from muralist_api.contract import COMPLETION_INDEX_ANNOTATION
from muralist_api.job import GROUP, PLURAL, VERSION

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for
from tests.operator_helpers import DJ

pytestmark = pytest.mark.cluster

JOB_LABEL = "muralist.dev/job-name"


def running_job(name: str = "cats", nodes: int = 2) -> dict[str, Any]:
    # An output every pod can mount on kwok's nodes (no PersistentVolumeClaim to bind).
    shared = {"hostPath": {"path": f"/tmp/muralist-{name}"}}
    return (make_job(name).output(volume=shared).world(nodes=nodes, gpus=1)
            .pod_template(annotations=fate_annotations("run")).obj())


def controller(obj: Any) -> tuple[str, str] | None:
    refs = [r for r in obj.metadata.owner_references or [] if r.controller]
    return (refs[0].kind, refs[0].uid) if refs else None


def test_a_same_name_foreign_config_map_fails_the_job_by_name(dj: DJ) -> None:
    dj.core.create_namespaced_config_map(dj.ns, {"metadata": {"name": "cats-spec"}, "data": {"notes": "mine"}})
    dj.create(running_job(nodes=1))
    failed = dj.wait_phase("cats", "Failed")
    assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["NameTaken"]
    assert failed["message"] == ("ConfigMap cats-spec already exists and is not this DiffusionJob's (nothing owns "
                                 "it): delete it, or create the DiffusionJob under another name")
    dj.wait_events("cats", "NameTaken")
    with pytest.raises(ApiException) as err:  # no pod ever read the stranger's ConfigMap as its spec
        dj.batch.read_namespaced_job("cats", dj.ns)
    assert err.value.status == 404
    theirs = dj.core.read_namespaced_config_map("cats-spec", dj.ns)
    assert theirs.data == {"notes": "mine"} and not theirs.metadata.owner_references


def test_deleted_children_come_back(dj: DJ) -> None:
    job = dj.create(running_job())
    dj.wait_pods("cats", 2)
    owner = ("DiffusionJob", job["metadata"]["uid"])
    readers = {
        "NetworkPolicy": lambda: client_networking(dj).read_namespaced_network_policy("cats", dj.ns),
        "Service": lambda: dj.core.read_namespaced_service("cats", dj.ns),
        "ConfigMap": lambda: dj.core.read_namespaced_config_map("cats-spec", dj.ns),
    }
    first = {kind: read().metadata.uid for kind, read in readers.items()}
    client_networking(dj).delete_namespaced_network_policy("cats", dj.ns)
    dj.core.delete_namespaced_service("cats", dj.ns)
    dj.core.delete_namespaced_config_map("cats-spec", dj.ns)

    def again(kind: str) -> Any:
        obj = readers[kind]()
        return obj if obj.metadata.uid != first[kind] else None

    for kind in readers:
        back = wait_for(lambda k=kind: again(k), timeout=60, message=f"the {kind} created again")
        assert controller(back) == owner, kind
    dj.wait_events("cats", "ChildRestored")
    assert dj.status("cats")["phase"] == "Running"


def client_networking(dj: DJ) -> Any:
    from kubernetes import client

    return client.NetworkingV1Api(dj.core.api_client)


def test_a_foreign_pod_with_the_jobs_labels_changes_nothing(dj: DJ) -> None:
    dj.create(running_job())
    pods = dj.wait_pods("cats", 2)
    dj.wait_phase("cats", "Running")
    # Anyone who may create pods in the namespace can label one as the job's pod of index 0, and
    # make it fail for good (exit 78, a permanent verdict); the job's own pods go on.
    forged = {
        "metadata": {"name": "cats-0-forged",
                     "labels": {JOB_LABEL: "cats", "app.kubernetes.io/component": "worker"},
                     "annotations": {COMPLETION_INDEX_ANNOTATION: "0",
                                     **fate_annotations("fail", exit_code=78, after="100ms",
                                                        message='{"permanent": true, "message": "forged"}')}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "runtime", "image": "muralist-runtime:test"}]},
    }
    dj.core.create_namespaced_pod(dj.ns, forged)
    wait_for(lambda: dj.core.read_namespaced_pod("cats-0-forged", dj.ns).status.phase == "Failed", timeout=30,
             message="the forged pod to fail")
    for p in pods:
        set_pod_fate(dj.core, p.metadata.name, dj.ns, "succeed", after="100ms")
    done = dj.wait_phase("cats", "Succeeded")
    assert (done["restarts"], done.get("indexes") or []) == (0, [])
    assert done["progress"]["summary"] == "2/2"


def test_a_job_created_again_under_its_name_waits_for_the_earlier_ones_children(dj: DJ) -> None:
    # `kubectl delete dj cats && kubectl apply -f cats.yaml` before the garbage collector is done:
    # the new job's pods must never read the earlier one's spec. A finalizer holds the earlier
    # spec ConfigMap on its way out for as long as the test wants.
    first = dj.create(running_job(nodes=1))
    wait_for(lambda: dj.batch.read_namespaced_job("cats", dj.ns), message="the first Job")
    dj.core.patch_namespaced_config_map("cats-spec", dj.ns, {"metadata": {"finalizers": ["muralist.dev/test-hold"]}})
    dj.custom.delete_namespaced_custom_object(GROUP, VERSION, dj.ns, PLURAL, "cats")
    wait_for(lambda: dj.core.read_namespaced_config_map("cats-spec", dj.ns).metadata.deletion_timestamp,
             timeout=60, message="the earlier spec ConfigMap being deleted")
    second = dj.create(running_job(nodes=1))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    waiting = wait_for(lambda: (s := dj.status("cats")).get("message", "").startswith("waiting for ConfigMap") and s,
                       message="the new job waiting for the earlier ConfigMap")
    assert waiting["phase"] == "Pending"
    assert waiting["message"] == "waiting for ConfigMap cats-spec of an earlier DiffusionJob of this name to be deleted"
    dj.core.patch_namespaced_config_map("cats-spec", dj.ns, {"metadata": {"finalizers": None}})
    dj.wait_phase("cats", "Running")
    spec = dj.core.read_namespaced_config_map("cats-spec", dj.ns)
    assert controller(spec) == ("DiffusionJob", second["metadata"]["uid"])
    job = dj.batch.read_namespaced_job("cats", dj.ns)
    assert controller(job) == ("DiffusionJob", second["metadata"]["uid"])
