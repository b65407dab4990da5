"""DiffusionJobs on a real node: kubelet and containerd run the runtime image, torchrun meets
across two pods through the headless Service, and the images land on a hostPath volume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from PIL import Image

from tests.cluster.test_pod_e2e import RUNTIME_POSTS_PROGRESS
from tests.e2e.conftest import REPO, RealCluster
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ

# The first test also builds the runtime image and imports it into containerd (minutes, cold).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
# Pods of their own worlds that claim work and push progress: the runtime side of issue 16.
needs_runtime = pytest.mark.skipif(not RUNTIME_POSTS_PROGRESS, reason="waits for the runtime side of issue 16 "
                                   "(a progress poster reading MURALIST_PROGRESS_URL, per-pod worlds, work claiming)")

# Pods start in seconds, then each imports torch and diffusers (~10 s on 2 busy cores).
RUN_TIMEOUT = 300


def quickstart_on_two_pods(namespace: str, volume: Path, name: str = "quickstart") -> dict[str, Any]:
    """examples/quickstart-real-node.yaml, the quickstart of docs/development/real-node.md (the CPU
    quickstart on 2 pods x 1 process, output on a hostPath), in a namespace and directory of the test's own."""
    job = yaml.safe_load((REPO / "examples" / "quickstart-real-node.yaml").read_text())
    assert job["spec"]["parallelism"] == {"strategy": "DataParallel", "nodes": 2, "gpusPerNode": 0,
                                          "processesPerNode": 1}
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"]["output"]["volume"]["hostPath"]["path"] = str(volume)
    return job


def expected_keys(job: dict[str, Any]) -> set[str]:
    per_prompt = job["spec"]["generation"]["imagesPerPrompt"]
    return {f"{p:05d}-{i:03d}" for p in range(len(job["spec"]["prompts"])) for i in range(per_prompt)}


def image_files(out: Path) -> dict[str, Path]:
    return {p.stem: p for p in (out / "images").glob("*.png")} if (out / "images").is_dir() else {}


def assert_complete_output(out: Path, job: dict[str, Any]) -> None:
    """Every image once, each a whole PNG with its metadata; the manifest and gallery name them."""
    keys = expected_keys(job)
    assert set(image_files(out)) == keys
    for key, png in image_files(out).items():
        with Image.open(png) as im:
            im.verify()  # a truncated or half-written file fails here
        assert json.loads((out / "images" / f"{key}.json").read_text())["key"] == key
    leftovers = [p.name for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, leftovers
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert sorted(entry["key"] for entry in manifest) == sorted(keys)  # each exactly once
    gallery = (out / "index.html").read_text()
    assert all(f"images/{key}.png" in gallery for key in keys)


def wait_done(dj: DJ, name: str, seen: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The finished status; `seen` collects every status while the job ran."""
    def finished() -> dict[str, Any] | None:
        status = dj.status(name)
        if seen is not None:
            seen.append(status)
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = wait_for(finished, timeout=RUN_TIMEOUT, interval=0.5, message=f"{name} to finish")
    assert status["phase"] == "Succeeded", status
    return status


def pod_logs(cluster: RealCluster, namespace: str, name: str) -> str:
    return cluster.kubectl(
        "logs", "-n", namespace, "-l", f"muralist.dev/job-name={name}", "--prefix", "--tail=40", check=False
    ).stdout


@needs_runtime
def test_quickstart_renders_across_two_real_pods(
    real_cluster: RealCluster, real_dj: DJ, e2e_namespace: str, host_volume: Path
) -> None:
    job = quickstart_on_two_pods(e2e_namespace, host_volume)
    # 24 steps, not 4: at 4 a pod can render its share between its first post and its last
    # (3 s apart), and a rate needs two posts of a running pod to divide by.
    job["spec"]["generation"]["steps"] = 24
    real_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    seen: list[dict[str, Any]] = []
    try:
        status = wait_done(real_dj, "quickstart", seen)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pod_logs(real_cluster, e2e_namespace, 'quickstart')}") from None

    out = host_volume / status["outputPath"]
    assert_complete_output(out, job)
    total = len(expected_keys(job))
    assert status["progress"]["completed"] == total and status["restarts"] == 0
    # Two pods, each a torchrun world of its own, claiming work from pod 0's store.
    ranks = {json.loads((out / "images" / f"{key}.json").read_text())["rank"] for key in expected_keys(job)}
    assert ranks == {0, 1}, "both pods rendered"
    # Progress came from the pods themselves, pushed over HTTPS to the operator on this host,
    # while they ran: a count and a rate before the end.
    running = [s for s in seen if s.get("phase") == "Running"]
    assert any(s["progress"]["completed"] > 0 for s in running), running[-3:]
    assert any(s["progress"].get("imagesPerSecond") for s in running), running[-3:]
    # The pods carry no API credentials.
    pod = client.CoreV1Api(real_cluster.api).list_namespaced_pod(
        e2e_namespace, label_selector="muralist.dev/job-name=quickstart").items[0]
    assert pod.spec.automount_service_account_token is False
    table = real_cluster.kubectl("get", "dj", "quickstart", "-n", e2e_namespace).stdout
    assert "Succeeded" in table and f"{total}/{total}" in table, table


@needs_runtime
def test_a_killed_pod_costs_only_its_unfinished_images(
    real_cluster: RealCluster, real_dj: DJ, e2e_namespace: str, host_volume: Path
) -> None:
    job = quickstart_on_two_pods(e2e_namespace, host_volume, name="killed")
    # Long enough to kill a pod part-way: 64 images at 8 steps.
    job["spec"]["generation"].update({"imagesPerPrompt": 8, "steps": 8})
    real_dj.create(job)
    out = host_volume / "killed"
    total = len(expected_keys(job))

    def some_images() -> dict[str, Path] | None:
        found = image_files(out)
        return found if len(found) >= 6 else None

    wait_for(some_images, timeout=RUN_TIMEOUT, interval=0.2, message="the first images on the volume")
    victim = real_dj.pods("killed", index=1)[0]
    survivor = real_dj.pods("killed", index=0)[0]
    before = {key: (p.stat().st_ino, p.stat().st_mtime_ns) for key, p in image_files(out).items()}
    client.CoreV1Api(real_cluster.api).delete_namespaced_pod(victim.metadata.name, e2e_namespace)
    assert len(before) < total, "the job finished before the kill: make it longer"

    try:
        status = wait_done(real_dj, "killed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pod_logs(real_cluster, e2e_namespace, 'killed')}") from None
    assert status["restarts"] >= 1, status
    assert [e["index"] for e in status["indexes"]] == [1], status["indexes"]
    # Only the killed pod was retried: pod 0 ran from start to end.
    assert [p.metadata.uid for p in real_dj.pods("killed", index=0)] == [survivor.metadata.uid]
    assert_complete_output(out, job)
    # What was on the volume when the pod died was kept, not rendered again.
    after = {key: (p.stat().st_ino, p.stat().st_mtime_ns) for key, p in image_files(out).items()}
    assert {key: after[key] for key in before} == before
