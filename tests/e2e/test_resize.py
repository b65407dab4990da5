"""A running job shrunk on the real node: `kubectl scale` removes its second pod in the middle of an
item; the pod drains (SIGTERM: it finishes the item in flight, keeps what it wrote, hands its chunk
back) and the first pod finishes the job with every image exactly once and nothing rendered twice."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import RealCluster
from tests.e2e.test_diffusion_job import (
    RUN_TIMEOUT,
    assert_complete_output,
    expected_keys,
    image_files,
    needs_runtime,
    pod_logs,
    quickstart_on_two_pods,
    wait_done,
)
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def ranks(out: Path) -> dict[str, int]:
    found = {}
    for key in image_files(out):
        try:
            found[key] = json.loads((out / "images" / f"{key}.json").read_text())["rank"]
        except (OSError, ValueError, KeyError):
            continue  # its metadata is being written
    return found


def started_on_two_pods(dj: DJ, namespace: str, volume: Path, name: str) -> tuple[dict[str, Any], Path]:
    """The real-node quickstart as 64 images on two pods, once the second pod has written two."""
    job = quickstart_on_two_pods(namespace, volume, name=name)
    job["spec"]["generation"].update({"imagesPerPrompt": 8, "steps": 8})  # time to act part-way
    dj.create(job)
    out = volume / name
    wait_for(lambda: list(ranks(out).values()).count(1) >= 2, timeout=RUN_TIMEOUT, interval=0.2,
             message="the second pod's first images on the volume")
    return job, out


def written(out: Path) -> dict[str, tuple[int, int]]:
    """Each image's inode and modification time: an image rendered again would change both."""
    return {key: (p.stat().st_ino, p.stat().st_mtime_ns) for key, p in image_files(out).items()}


@needs_runtime
def test_a_job_shrunk_while_running_loses_nothing_and_renders_nothing_twice(
    real_cluster: RealCluster, real_dj: DJ, e2e_namespace: str, host_volume: Path
) -> None:
    job, out = started_on_two_pods(real_dj, e2e_namespace, host_volume, "shrink")
    total = len(expected_keys(job))
    second = real_dj.pods("shrink", index=1)[0]
    # Its log, followed to its end (the pod object goes once the Job controller has counted it).
    follow = subprocess.Popen([str(real_cluster.bin_dir / "kubectl"), f"--kubeconfig={real_cluster.kubeconfig}",
                               "logs", "-f", "-n", e2e_namespace, second.metadata.name],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    before = written(out)
    signalled = time.time()
    real_cluster.kubectl("scale", "-n", e2e_namespace, "dj/shrink", "--replicas=1")
    assert len(before) < total, "the job finished before the resize: make it longer"

    try:
        status = wait_done(real_dj, "shrink")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pod_logs(real_cluster, e2e_namespace, 'shrink')}") from None
    assert status["restarts"] == 0 and not status.get("indexes"), status
    assert status["nodes"] == 1 and status["progress"]["completed"] == total, status
    assert_complete_output(out, job)
    # What was on the volume at the resize was kept, not rendered again; the second pod wrote at
    # most its item in flight after the signal (and the one before it, if the signal came first).
    after = written(out)
    assert {key: after[key] for key in before} == before
    late = [k for k, r in ranks(out).items() if r == 1 and k not in before
            and (out / "images" / f"{k}.png").stat().st_mtime > signalled]
    assert len(late) <= 2, late
    # The pod said why it stopped, on one line, with no traceback or launcher report.
    log, _ = follow.communicate(timeout=120)
    assert "muralist: drained: stopped" in log, log[-3000:]
    assert "Traceback" not in log and "ChildFailedError" not in log, log[-3000:]


@needs_runtime
def test_an_evicted_pod_drains_and_is_started_again_without_counting_as_a_failure(
    real_cluster: RealCluster, real_dj: DJ, e2e_namespace: str, host_volume: Path
) -> None:
    from kubernetes import client

    job, out = started_on_two_pods(real_dj, e2e_namespace, host_volume, "evicted")
    total = len(expected_keys(job))
    victim = real_dj.pods("evicted", index=1)[0]
    before = written(out)
    # What a node drain or the scheduler's preemption does: the eviction API (DisruptionTarget, then SIGTERM).
    client.CoreV1Api(real_cluster.api).create_namespaced_pod_eviction(
        victim.metadata.name, e2e_namespace,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=victim.metadata.name, namespace=e2e_namespace)))
    assert len(before) < total, "the job finished before the eviction: make it longer"
    try:
        status = wait_done(real_dj, "evicted")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pod_logs(real_cluster, e2e_namespace, 'evicted')}") from None
    # Started again (the index has a new pod: exit 143, not 0, which would have ended the index),
    # and not counted against maxRestarts.
    assert status["restarts"] == 0 and not status.get("indexes"), status
    again = [p for p in real_dj.pods("evicted", index=1) if p.metadata.uid != victim.metadata.uid]
    assert [p.status.phase for p in again] == ["Succeeded"], again
    assert_complete_output(out, job)
    after = written(out)
    assert {key: after[key] for key in before} == before, "what was written before the eviction was kept"
