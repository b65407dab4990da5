"""strategy: Auto in the operator: the devices from the nodes' labels or the pods' resources, the plan
made once and kept in status, the objects rendered from it, the Planned condition, and the cost."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from muralist_api.planner.table import CannotPlan
from muralist_api.runtime_spec import read_runtime_spec
from muralist_api.status import DiffusionJobStatus
from muralist_operator import planning
from muralist_operator.decision import Decision
from muralist_operator.lifecycle import decide
from muralist_operator.observe import Observed
from muralist_operator.render import render_children
from muralist_operator.settings import OperatorSettings

from tests.builders import make_job
from tests.views import NOW, job_view, pod

H100 = {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "h100"}
L4 = {"nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.product": "NVIDIA-L4", "pool": "l4"}


def auto(model: str = "black-forest-labs/FLUX.1-dev", gpus: int = 4, **parallelism: object):
    job = make_job().set("spec.model", {"name": model}).set("spec.parallelism", {
        "strategy": "Auto", "gpusPerNode": gpus, **parallelism})
    if model.startswith("muralist/tiny-wan"):
        job.generation(height=64, width=64, numFrames=17).output(format="mp4")
    return job


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_the_devices_come_from_the_nodes_a_job_may_land_on() -> None:
    job = auto().pod_template(nodeSelector={"pool": "l4"}).job()
    assert planning.node_selector(job) == "pool=l4,nvidia.com/gpu.memory"
    device = planning.device_for(job, [L4])
    assert (device.memory, device.interconnect, device.count) == (23034 << 20, "pcie", 4)
    unlabelled = planning.device_for(job, [])
    assert unlabelled.memory == 0 and "memory is unknown" in unlabelled.source


def test_without_gpus_the_pods_memory_is_the_budget_of_its_processes() -> None:
    job = auto("muralist/tiny-wan", 0, processesPerNode=2).set("spec.resources", {"limits": {"memory": "1Gi"}}).job()
    device = planning.device_for(job, [])
    assert (device.gpu, device.count, device.memory) == (False, 2, 512 << 20)
    assert planning.device_for(auto("muralist/tiny-wan", 0).job(), []).memory == 0


def test_the_plan_renders_the_pods_and_travels_to_them() -> None:
    job = auto(objective="latency").job()
    plan = planning.plan_for(job, [H100])
    assert plan.summary.startswith("ContextParallel ulysses 4") and plan.device_memory_bytes == 81559 << 20
    assert plan.model_source == "the planner's catalog figures for black-forest-labs/FLUX.1-dev"
    planned = planning.apply(job, plan)
    children = render_children(planned, "ns", OperatorSettings())
    container = children.job["spec"]["template"]["spec"]["containers"][0]
    assert env(container)["PET_NPROC_PER_NODE"] == "4"
    runtime = read_runtime_spec(children.spec_config_map["data"]["spec.json"])
    assert runtime.spec.parallelism.strategy == "ContextParallel" and runtime.parallel_plan == plan
    assert runtime.spec.parallelism.context_parallel is not None
    assert runtime.spec.parallelism.context_parallel.ulysses_degree == 4
    # 22.5 GiB L4s on PCIe: FLUX.1's transformer alone does not fit one, and PCIe rules tensor parallel out.
    with pytest.raises(CannotPlan, match="tensor parallelism needs NVLink"):
        planning.plan_for(auto(gpus=4).job(), [L4])


def test_the_planned_condition_says_it_once() -> None:
    job = auto().job()
    plan = planning.plan_for(job, [H100])
    decision = Decision(status=DiffusionJobStatus())
    planning.note(decision, plan, NOW, 1)
    planning.note(decision, plan, NOW, 1)
    (condition,) = [c for c in decision.status.conditions if c.type == "Planned"]
    assert condition.reason == "AutoPlanned" and condition.message.startswith("throughput: DataParallel over 4")
    assert "fits: the whole pipeline on one device" in condition.message and "79.6 GiB" in condition.message
    assert [e.reason for e in decision.events] == ["AutoPlanned"]


def test_a_running_job_counts_its_gpu_seconds() -> None:
    job = planning.apply(auto(gpus=2).job(), planning.plan_for(auto(gpus=2).job(), [H100]))
    started = decide(job, DiffusionJobStatus(phase="Pending"), 1, Observed(job=job_view(), pods=[pod(0)]), NOW)
    assert started.status.cost is not None and started.status.cost.running_gpus == 2
    later = decide(job, started.status, 1, Observed(job=job_view(), pods=[pod(0)], price_per_gpu_hour=2.0),
                   NOW + timedelta(seconds=90))
    assert later.status.cost is not None
    assert (later.status.cost.gpu_seconds, later.status.cost.cost_so_far) == (180, 0.1)
    assert json.loads(later.status.model_dump_json(by_alias=True))["cost"]["pricePerGpuHour"] == 2.0
