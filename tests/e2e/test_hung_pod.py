"""Every wait ends, on a real node: a one-process pod whose only rank hangs is found by the
operator's default stall timeout (the manifest sets none) and retried, and the job ends.

The hang is a real one, no test knob: an item's input image is a named pipe on the inputs
volume, so the rank blocks in its read after it has rendered the items before it (a network
volume that stops answering). Its pod keeps posting (the poster is a thread of its own), its
steps stop. Once the operator has retried the pod, the test puts an image in the pipe's place,
as someone fixing the volume would.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from PIL import Image

from tests.e2e.conftest import RealCluster
from tests.e2e.test_diffusion_job import RUN_TIMEOUT, needs_runtime, pod_logs, wait_done
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def hung_job(namespace: str, output: Path, inputs: Path) -> dict:
    return {
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": "hung", "namespace": namespace},
        "spec": {
            "model": {"name": "muralist/tiny-flux", "dtype": "float32", "pipeline": "FluxImg2ImgPipeline"},
            "prompts": [{"text": "a red fox", "image": "red.png"}, {"text": "a lighthouse", "image": "red.png"},
                        {"text": "a castle", "image": "stuck.png"}],
            "inputs": {"volume": {"hostPath": {"path": str(inputs), "type": "Directory"}}},
            "generation": {"steps": 4, "height": 32, "width": 32, "extraArgs": {"max_sequence_length": 16}},
            # One pod, one process: nobody in the pod to notice its only rank. No
            # stallTimeoutSeconds: the default is 10x the slowest gap between steps, at least
            # this (the least the API allows: a short test).
            "parallelism": {"strategy": "DataParallel", "nodes": 1, "gpusPerNode": 0, "processesPerNode": 1,
                            "collectiveTimeoutSeconds": 10},
            "output": {"format": "png", "volume": {"hostPath": {"path": str(output)}}},
        },
    }


@needs_runtime
def test_a_hung_rank_in_a_one_process_pod_is_retried_by_default(
    real_cluster: RealCluster, real_dj: DJ, e2e_namespace: str, host_volume: Path, tmp_path: Path
) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    Image.new("RGB", (32, 32), (200, 40, 40)).save(inputs / "red.png")
    os.mkfifo(inputs / "stuck.png", 0o644)
    inputs.chmod(0o755)
    job = hung_job(e2e_namespace, host_volume, inputs)
    assert "stallTimeoutSeconds" not in job["spec"].get("runPolicy", {})
    real_dj.create(job)
    start = time.monotonic()
    try:
        retried = wait_for(lambda: (s := real_dj.status("hung")).get("restarts") == 1 and s, timeout=RUN_TIMEOUT,
                           interval=0.5, message="the hung pod retried")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pod_logs(real_cluster, e2e_namespace, 'hung')}") from None
    found = time.monotonic() - start
    (inputs / "stuck.png").unlink()
    Image.new("RGB", (32, 32), (40, 40, 200)).save(inputs / "stuck.png")

    [index] = retried["indexes"]
    assert (index["index"], index["lastFailureReason"]) == (0, "Stalled"), index
    assert "runPolicy.stallTimeoutSeconds unset" in index["lastFailure"], index["lastFailure"]
    real_dj.wait_events("hung", "Stalled")
    try:
        status = wait_done(real_dj, "hung")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pod_logs(real_cluster, e2e_namespace, 'hung')}") from None
    assert status["restarts"] == 1 and status["progress"]["summary"] == "3/3", status
    out = host_volume / "hung"
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    # The items its first pod rendered before it hung are kept by the retry, which renders the third.
    assert [(m["key"], m["status"]) for m in manifest] == [("00000-000", "skipped"), ("00001-000", "skipped"),
                                                           ("00002-000", "rendered")]
    assert (status["progress"]["kept"], status["progress"]["rerendered"]) == (2, 0), status
    print(f"hung one-process pod: retried after {found:.0f}s, job done after {time.monotonic() - start:.0f}s")
