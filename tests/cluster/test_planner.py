"""strategy: Auto on the test control plane: the operator plans from what it can see (a kwok node's GPU
feature discovery labels; the pods' memory for a job without GPUs), says why in status, renders the
chosen layout, and counts the cost of the running pods."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, wait_for
from tests.operator_helpers import DJ

pytestmark = pytest.mark.cluster

NODE = "kwok-gpu-0"
H100 = {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "muralist.dev/interconnect": "nvlink"}


@pytest.fixture
def h100_pool(dj: DJ) -> Iterator[dict[str, str]]:
    """One kwok node labelled as GPU feature discovery labels an 8-GPU H100 node, in a pool of this test's
    own; the labels are taken off again."""
    pool = {"muralist.dev/test-pool": dj.ns}
    dj.core.patch_node(NODE, {"metadata": {"labels": {**H100, **pool}}})
    try:
        yield pool
    finally:
        dj.core.patch_node(NODE, {"metadata": {"labels": dict.fromkeys([*H100, *pool])}})


def env(dj: DJ, name: str) -> dict[str, str]:
    job = wait_for(lambda: dj.batch.read_namespaced_job(name, dj.ns), message=f"Job {name}")
    return {e.name: e.value for e in job.spec.template.spec.containers[0].env if e.value is not None}


def planned(dj: DJ, name: str) -> dict[str, Any]:
    plan: dict[str, Any] = wait_for(lambda: dj.status(name).get("parallelPlan"), message=f"{name}'s plan")
    return plan


def test_auto_plans_from_the_nodes_labels_and_counts_the_cost(dj: DJ, control_plane: Any,
                                                             h100_pool: dict[str, str]) -> None:
    job = make_job("flux").set("spec.model", {"name": "black-forest-labs/FLUX.1-dev"})
    job.set("spec.parallelism", {"strategy": "Auto", "gpusPerNode": 4})
    job.pod_template(nodeSelector=h100_pool, annotations=fate_annotations("run"))
    job.set("metadata.annotations", {"muralist.dev/price-per-gpu-hour": "3.6"})
    dj.create(job.obj())
    plan = planned(dj, "flux")
    assert plan["parallelism"] == {"strategy": "DataParallel", "gpusPerNode": 4}
    assert plan["device"].startswith("4 x NVIDIA-H100-80GB-HBM3, 79.6 GiB each, NVLink (node labels of 1 node(s)")
    assert plan["reasons"][0].startswith("fits: the whole pipeline on one device")
    assert plan["memory"]["peakBytes"] > 30 << 30
    assert env(dj, "flux")["PET_NPROC_PER_NODE"] == "4"
    spec = json.loads(dj.core.read_namespaced_config_map("flux-spec", dj.ns).data["spec.json"])
    # The pods get the chosen layout (DataParallel: the default, left out of the wire form) and the plan.
    assert spec["spec"]["parallelism"] == {"gpusPerNode": 4} and spec["parallelPlan"]["reasons"] == plan["reasons"]
    running = dj.wait_phase("flux", "Running")
    (condition,) = [c for c in running["conditions"] if c["type"] == "Planned"]
    assert condition["reason"] == "AutoPlanned" and condition["message"].startswith("throughput: DataParallel")
    dj.wait_events("flux", "AutoPlanned")
    assert running["cost"]["runningGpus"] == 4 and running["cost"]["pricePerGpuHour"] == 3.6
    # Another price, later: the cost is brought up to date, counted at the new price.
    dj.custom.patch_namespaced_custom_object("muralist.dev", "v1alpha1", dj.ns, "diffusionjobs", "flux", {
        "metadata": {"annotations": {"muralist.dev/price-per-gpu-hour": "7.2"}}})
    cost = wait_for(lambda: (c := dj.status("flux").get("cost") or {}).get("pricePerGpuHour") == 7.2
                    and c["gpuSeconds"] > 0 and c, message="the cost at the new price")
    assert cost["costSoFar"] == pytest.approx(cost["gpuSeconds"] / 3600 * 7.2, abs=1e-3)
    wide = subprocess.run([str(control_plane.bin_dir / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig),
                           "-n", dj.ns, "get", "dj", "flux", "-o", "wide"], capture_output=True, text=True, check=True)
    assert "PLAN" in wide.stdout and "GPU-S/ITEM" in wide.stdout and "DataParallel over 4 device(s)" in wide.stdout


def test_auto_splits_a_long_video_over_the_pods_processes_for_latency(dj: DJ) -> None:
    # No GPUs: the pod's memory, shared by its 2 processes, stands for the devices'.
    job = make_job("clip").set("spec.model", {"name": "muralist/tiny-wan", "dtype": "float32"})
    job.generation(height=64, width=64, numFrames=17).output(format="mp4").prompts("a red fox")
    job.set("spec.parallelism", {"strategy": "Auto", "objective": "latency", "gpusPerNode": 0,
                                 "processesPerNode": 2})
    job.set("spec.resources", {"limits": {"memory": "2Gi"}}).pod_template(annotations=fate_annotations("run"))
    dj.create(job.obj())
    plan = planned(dj, "clip")
    assert plan["parallelism"] == {"strategy": "ContextParallel", "gpusPerNode": 0, "processesPerNode": 2,
                                   "contextParallel": {"ringDegree": 1, "ulyssesDegree": 2,
                                                       "attentionBackend": "native"}}
    assert plan["device"] == "2 x CPU process, 1.0 GiB each (resources memory 2Gi shared by 2 process(es))"
    assert [r.split(":")[0] for r in plan["reasons"]] == ["fits", "latency"]
    assert "ulysses 2 divides the 2 heads and splits the 80 tokens 40 per rank" in plan["reasons"][1]
    assert env(dj, "clip")["PET_NPROC_PER_NODE"] == "2"
    assert dj.status("clip")["worldSize"] == 2 and dj.status("clip")["dataParallelDegree"] == 1


def test_a_job_no_layout_fits_fails_with_the_figures(dj: DJ, h100_pool: dict[str, str]) -> None:
    job = make_job("big").set("spec.model", {"name": "black-forest-labs/FLUX.2-dev"})
    job.set("spec.parallelism", {"strategy": "Auto", "gpusPerNode": 1}).pod_template(nodeSelector=h100_pool)
    dj.create(job.obj())
    failed = dj.wait_phase("big", "Failed")
    assert "CannotPlan" in {c.get("reason") for c in failed["conditions"]}
    assert "the weights (104.9 GiB) do not fit one GPU" in failed["message"]
    assert not dj.batch.list_namespaced_job(dj.ns).items
