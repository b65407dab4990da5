"""A preempted pod's video item resumes from its checkpoint on the real node (runPolicy.checkpoint).

One pod renders tiny-Wan videos, saving each item's denoising state every 8 steps. Once an item is part-way,
the pod is evicted (what the scheduler's or Kueue's preemption and a node drain do: DisruptionTarget, then
SIGTERM): it stops at the end of the step in flight, saves the item's state next to its output and exits 143;
the Job starts the index again (not counted against maxRestarts), and the new pod resumes that item from its
checkpoint. The same job rendered straight under another name gives the same video files, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import RealCluster
from tests.e2e.test_diffusion_job import RUN_TIMEOUT, needs_runtime, pod_logs, wait_done
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

STEPS, EVERY = 60, 8
PROMPTS = ["a red fox in a snowy forest", "a lighthouse in a storm", {"text": "a boat at night", "seed": 42}]
KEYS = [f"{i:05d}-000" for i in range(len(PROMPTS))]


def video_job(namespace: str, volume: Path, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "muralist/tiny-wan", "dtype": "float32"},
            "prompts": PROMPTS,
            "generation": {"steps": STEPS, "height": 64, "width": 64, "numFrames": 17, "fps": 8,
                           "extraArgs": {"max_sequence_length": 32}},
            "parallelism": {"strategy": "DataParallel", "nodes": 1, "gpusPerNode": 0, "processesPerNode": 1},
            "output": {"format": "mp4", "volume": {"hostPath": {"path": str(volume), "type": "Directory"}}},
            "runPolicy": {"checkpoint": {"everySteps": EVERY}},
        },
    }


def part_way(out: Path) -> tuple[str, int] | None:
    """An item whose last render has steps done, and how many (its checkpoint note)."""
    for note in sorted((out / "checkpoints").glob("*.json")):
        try:
            step = int(json.loads(note.read_text())["step"])
        except (OSError, ValueError, KeyError):
            continue  # being written
        if EVERY <= step < STEPS - EVERY:
            return note.stem, step
    return None


def videos(out: Path) -> dict[str, bytes]:
    return {key: (out / "images" / f"{key}.mp4").read_bytes() for key in KEYS}


@needs_runtime
def test_a_preempted_pods_video_item_resumes_from_its_checkpoint_in_the_restarted_pod(
    real_cluster: RealCluster, real_dj: DJ, e2e_namespace: str, host_volume: Path
) -> None:
    from kubernetes import client

    real_dj.create(video_job(e2e_namespace, host_volume, "preempted"))
    out = host_volume / "preempted"
    found = wait_for(lambda: part_way(out), timeout=RUN_TIMEOUT, interval=0.1, message="an item part-way")
    assert found is not None
    key, noted = found
    victim = real_dj.pods("preempted", index=0)[0]
    client.CoreV1Api(real_cluster.api).create_namespaced_pod_eviction(
        victim.metadata.name, e2e_namespace,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=victim.metadata.name, namespace=e2e_namespace)))
    try:
        status = wait_done(real_dj, "preempted")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pod_logs(real_cluster, e2e_namespace, 'preempted')}") from None
    assert status["restarts"] == 0 and not status.get("indexes"), "a preemption is no failure"
    again = [p for p in real_dj.pods("preempted", index=0) if p.metadata.uid != victim.metadata.uid]
    assert [p.status.phase for p in again] == ["Succeeded"], again
    log = real_cluster.kubectl("logs", "-n", e2e_namespace, again[0].metadata.name).stdout

    manifest = {e["key"]: e for e in map(json.loads, (out / "manifest.jsonl").read_text().splitlines())}
    assert sorted(manifest) == KEYS
    resumed = manifest[key]["resumedFromStep"]
    assert noted <= resumed < STEPS, "saved where the stop found it, at or after the step seen"
    assert f"item {key} resumes from its checkpoint at step {resumed} of {STEPS}" in log, log[-3000:]
    assert status["progress"]["stepsSaved"] == sum(e.get("stepsSaved", 0) for e in manifest.values()) >= resumed
    assert status["progress"]["stepsLost"] == 0, "a stop with onTerminate saves where it is"
    assert not (out / "checkpoints").exists(), "deleted once the items are written"

    # The same job straight: the same files.
    real_dj.create(video_job(e2e_namespace, host_volume, "straight"))
    wait_done(real_dj, "straight")
    assert videos(out) == videos(host_volume / "straight")
