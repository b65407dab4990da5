"""Each job's NetworkPolicy on the real API server: created with the job, and selecting and
admitting exactly that job's pods (evaluated with the API server's own label selectors: see
tests/network_policies.py); kwok plays the pods."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, wait_for
from tests.network_policies import admitted, selected
from tests.operator_helpers import DJ

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def other_namespace(core_v1: Any) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core_v1.create_namespace({"metadata": {"name": name, "labels": {"muralist.dev/test": "true"}}})
    wait_for(lambda: core_v1.read_namespaced_service_account("default", name), message=f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        core_v1.delete_namespace(name)


def bare_pod(core_v1: Any, namespace: str, name: str, labels: dict[str, str]) -> None:
    core_v1.create_namespaced_pod(namespace, {"metadata": {"name": name, "labels": labels},
                                              "spec": {"containers": [{"name": "c", "image": "example.com/web"}]}})


def running(name: str, nodes: int) -> Any:
    return make_job(name).world(nodes=nodes, gpus=1).pod_template(annotations=fate_annotations("run"))


def test_a_jobs_policy_selects_and_admits_exactly_its_own_pods(dj: DJ, other_namespace: str) -> None:
    there = DJ(dj.core.api_client, other_namespace)
    dj.create(running("cats", nodes=2).obj())
    # Another job beside it, which says no to a policy of its own: its pods are open, and not
    # admitted by cats'.
    dj.create(running("dogs", nodes=1).set("spec.networkPolicy.enabled", False).obj())
    # A job of the same name in another namespace: its pods carry the same job label.
    there.create(running("cats", nodes=1).obj())
    cats = {(dj.ns, p.metadata.name) for p in dj.wait_pods("cats", 2)}
    dj.wait_pods("dogs", 1)
    cats_there = {(other_namespace, p.metadata.name) for p in there.wait_pods("cats", 1)}
    # Anyone else's pods, even one that claims to be a pod of cats (another namespace's).
    bare_pod(dj.core, dj.ns, "web", {"app": "web"})
    bare_pod(dj.core, other_namespace, "impostor", {"muralist.dev/job-name": "cats", "app": "web"})

    networking = client.NetworkingV1Api(dj.core.api_client)
    raw = wait_for(lambda: networking.read_namespaced_network_policy("cats", dj.ns), message="NetworkPolicy cats")
    owner = raw.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller) == ("DiffusionJob", "cats", True)
    policy = dj.core.api_client.sanitize_for_serialization(raw)
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress untouched
    namespaces = [dj.ns, other_namespace]
    assert selected(dj.core, policy) == cats
    # To every port (the claim store, the rendezvous, and gloo's and NCCL's own): only cats' pods.
    assert admitted(dj.core, policy, namespaces) == cats
    assert admitted(dj.core, policy, namespaces, port=29400) == cats

    there_policy = dj.core.api_client.sanitize_for_serialization(
        networking.read_namespaced_network_policy("cats", other_namespace))
    assert selected(dj.core, there_policy) == admitted(dj.core, there_policy, namespaces) == cats_there | {
        (other_namespace, "impostor")}  # what a label can claim in its own namespace (docs/concepts/world.md)
    assert [p.metadata.name for p in networking.list_namespaced_network_policy(dj.ns).items] == ["cats"]

    dj.custom.delete_namespaced_custom_object("muralist.dev", "v1alpha1", dj.ns, "diffusionjobs", "cats")
    wait_for(lambda: [p.metadata.name for p in networking.list_namespaced_network_policy(dj.ns).items] == [],
             timeout=60, message="the NetworkPolicy garbage-collected with its job")


def test_the_policies_muralist_render_prints_are_accepted_by_the_api_server(control_plane: Any, namespace: str) -> None:
    out = subprocess.run([sys.executable, "-m", "muralist_cli", "render", "-n", namespace,
                          *sorted(str(p) for p in (REPO / "examples").glob("*.yaml"))],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    policies = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "NetworkPolicy"]
    assert len(policies) == len(list((REPO / "examples").glob("*.yaml")))  # one per job, none switched off
    kubectl = [str(control_plane.bin_dir / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig)]
    proc = subprocess.run([*kubectl, "apply", "--server-side", "--dry-run=server", "-o", "name", "-f", "-"],
                          input=yaml.safe_dump_all(policies), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split()) == len(policies), proc.stdout
