"""Smoke tests of the test control plane itself: what the operator's cluster tests rely on."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for

pytestmark = pytest.mark.cluster

GROUP = "smoke.muralist.dev"


def _gone(read: Any, *args: str) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def _pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "muralist-runtime:test"}],
        },
    }


def _phase(core_v1: client.CoreV1Api, name: str, namespace: str) -> str:
    return core_v1.read_namespaced_pod(name, namespace).status.phase


def test_kubectl_sees_fake_gpu_nodes(control_plane: Any) -> None:
    out = subprocess.run(
        ["kubectl", "get", "nodes", "-l", "type=kwok", "-o", "json"],
        env={**os.environ, **control_plane.env()},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    nodes = json.loads(out)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["kwok-gpu-0", "kwok-gpu-1"]
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert not node["spec"].get("taints")


def test_cel_validation_rule_rejects_with_its_message(kube_api: Any, namespace: str) -> None:
    ext = client.ApiextensionsV1Api(kube_api)
    plural, kind = "ranges", "Range"
    crd_name = f"{plural}.{GROUP}"
    message = "spec.min must not exceed spec.max"
    ext.create_custom_resource_definition(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": crd_name},
            "spec": {
                "group": GROUP,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": "range", "kind": kind},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "properties": {
                                            "min": {"type": "integer"},
                                            "max": {"type": "integer"},
                                        },
                                        "x-kubernetes-validations": [
                                            {"rule": "self.min <= self.max", "message": message}
                                        ],
                                    }
                                },
                            }
                        },
                    }
                ],
            },
        }
    )
    try:
        custom = client.CustomObjectsApi(kube_api)

        def create(name: str, lo: int, hi: int) -> Any:
            body = {
                "apiVersion": f"{GROUP}/v1",
                "kind": kind,
                "metadata": {"name": name},
                "spec": {"min": lo, "max": hi},
            }
            return custom.create_namespaced_custom_object(GROUP, "v1", namespace, plural, body)

        # The CRD is served a moment after it is created: retry the valid object until then.
        wait_for(lambda: create("ok", 1, 2), timeout=30, message=f"CRD {crd_name} served")
        with pytest.raises(ApiException) as err:
            create("bad", 3, 2)
        assert err.value.status == 422
        assert message in err.value.body
    finally:
        ext.delete_custom_resource_definition(crd_name)


def test_indexed_job_pods_run_on_kwok_nodes_and_complete(kube_api: Any, namespace: str) -> None:
    batch = client.BatchV1Api(kube_api)
    core = client.CoreV1Api(kube_api)
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "render"},
            "spec": {
                "completions": 2,
                "parallelism": 2,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "template": {
                    # Running until told: both pods hold their 8 GPUs at once (a pod that has
                    # finished holds none, so one started after the other ended may share its node).
                    "metadata": {"annotations": {"fate.muralist.dev/outcome": "run"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "muralist-runtime:test",
                                "resources": {"limits": {"nvidia.com/gpu": "8"}},
                            }
                        ],
                    },
                },
            },
        },
    )

    def pods() -> list[Any]:
        return list(core.list_namespaced_pod(namespace, label_selector="job-name=render").items)

    wait_for(lambda: [p.status.phase for p in pods()] == ["Running"] * 2, timeout=60,
             message="both pods of Job render Running")
    # 8 GPUs each, both held: the two pods can only fit on different nodes.
    assert sorted(p.spec.node_name for p in pods()) == ["kwok-gpu-0", "kwok-gpu-1"]
    for pod in pods():
        core.patch_namespaced_pod(pod.metadata.name, namespace,
                                  {"metadata": {"annotations": {"fate.muralist.dev/outcome": "succeed",
                                                                "fate.muralist.dev/after": "0s"}}})

    def complete() -> bool:
        conditions = batch.read_namespaced_job("render", namespace).status.conditions or []
        return any(c.type == "Complete" and c.status == "True" for c in conditions)

    wait_for(complete, timeout=60, message="Job render Complete")
    finished = pods()
    assert sorted(p.spec.node_name for p in finished) == ["kwok-gpu-0", "kwok-gpu-1"]
    indexes = sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in finished)
    assert indexes == ["0", "1"]
    for pod in finished:
        assert pod.status.phase == "Succeeded"
        assert pod.status.pod_ip
        terminated = pod.status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason) == (0, "Completed")


def test_garbage_collector_follows_owner_references(core_v1: client.CoreV1Api, namespace: str) -> None:
    owner = core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core_v1.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "child",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "owner",
                        "uid": owner.metadata.uid,
                    }
                ],
            }
        },
    )
    core_v1.delete_namespaced_config_map("owner", namespace)
    wait_for(
        lambda: _gone(core_v1.read_namespaced_config_map, "child", namespace),
        timeout=60,
        message="child ConfigMap garbage-collected",
    )


def test_pod_fails_on_demand_with_exit_code_and_message(core_v1: client.CoreV1Api, namespace: str) -> None:
    core_v1.create_namespaced_pod(namespace, _pod("worker", fate_annotations("run")))
    wait_for(lambda: _phase(core_v1, "worker", namespace) == "Running", message="worker Running")
    set_pod_fate(
        core_v1,
        "worker",
        namespace,
        "fail",
        exit_code=3,
        message="CUDA out of memory on rank 1",
        after="100ms",
    )
    wait_for(lambda: _phase(core_v1, "worker", namespace) == "Failed", message="worker Failed")
    status = core_v1.read_namespaced_pod("worker", namespace).status.container_statuses[0]
    terminated = status.state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    assert terminated.message == "CUDA out of memory on rank 1"
    assert status.state.running is None


def test_pod_told_to_run_stays_running_while_sibling_succeeds(core_v1: client.CoreV1Api, namespace: str) -> None:
    # The holder would succeed first (2s < 4s) unless changing its fate cancels that.
    for name, after in (("holder", "2s"), ("sibling", "4s")):
        core_v1.create_namespaced_pod(namespace, _pod(name, fate_annotations("succeed", after=after)))
    wait_for(lambda: _phase(core_v1, "holder", namespace) == "Running", message="holder Running")
    set_pod_fate(core_v1, "holder", namespace, "run")
    wait_for(lambda: _phase(core_v1, "sibling", namespace) == "Succeeded", message="sibling Succeeded")
    holder = core_v1.read_namespaced_pod("holder", namespace)
    assert holder.status.phase == "Running"
    assert holder.status.container_statuses[0].state.running is not None

    # Deleting a running pod works as with a kubelet: it is gone, not stuck terminating.
    core_v1.delete_namespaced_pod("holder", namespace)
    wait_for(
        lambda: _gone(core_v1.read_namespaced_pod, "holder", namespace),
        timeout=30,
        message="holder deleted",
    )
