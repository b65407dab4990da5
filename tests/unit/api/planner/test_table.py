"""The decision table over the public models' real sizes and the device profiles people run them on.

Every row reads the model from a hub-shaped folder (sparse safetensors: the real headers), plans it for
a device profile (24, 48, 80, 141 GiB; NVLink or PCIe; 8 GPUs a pod unless said) and checks the rules
that chose the layout, its degrees, and that the section it resolves to passes `muralist validate`'s
rules when put back into the manifest (with each degree dividing the pod's devices, the heads and, on
CPU, the sequence).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from muralist_api.job import DiffusionJobSpec, spec_problems
from muralist_api.planner.confirm import Measured, confirm_problems
from muralist_api.planner.device import GIB, Device
from muralist_api.planner.facts import Component, ModelFacts, read_folder
from muralist_api.planner.known import known_facts
from muralist_api.planner.memory import sequence
from muralist_api.planner.table import CannotPlan, Choice, blocked_by, decide, plan_job, planned, workload_of

from tests.builders import make_job

SDXL, FLUX1, FLUX2 = ("stabilityai/stable-diffusion-xl-base-1.0", "black-forest-labs/FLUX.1-dev",
                      "black-forest-labs/FLUX.2-dev")
QWEN, WAN1, WAN14 = "Qwen/Qwen-Image", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "Wan-AI/Wan2.1-T2V-14B-Diffusers"
VIDEOS = {WAN1, WAN14}
PROFILES = (24, 48, 80, 141)


def auto_spec(model: str, gpus: int = 8, objective: str | None = None, processes: int | None = None,
              **generation: Any) -> DiffusionJobSpec:
    video = model in VIDEOS or model.startswith("muralist/tiny-wan")
    gen = {"steps": 28, "height": 480 if video else 1024, "width": 832 if video else 1024, **generation}
    if video:
        gen.setdefault("numFrames", 81)
    job = make_job().set("spec.model", {"name": model, "dtype": "bfloat16"}).generation(**gen)
    job.set("spec.parallelism", {"strategy": "Auto", "gpusPerNode": gpus, **(
        {"objective": objective} if objective else {}), **({"processesPerNode": processes} if processes else {})})
    if video:
        job.output(format="mp4")
    return job.job().spec


def check(spec: DiffusionJobSpec, facts: ModelFacts | None, device: Device) -> Choice:
    """The table's choice, and what every choice must satisfy."""
    choice = decide(facts, device, workload_of(spec), spec.parallelism.objective or "throughput",
                    spec.parallelism.nodes, blocked_by(spec))
    resolved = planned(spec, plan_job(spec, facts, device))
    assert spec_problems(resolved) == []  # the section put back passes validate's rules
    par = resolved.parallelism
    assert par.resolved_processes_per_node % par.group_size == 0  # groups stay inside a pod
    heads = facts.heads if facts else None
    if par.context_parallel is not None and heads:
        assert heads % par.context_parallel.ulysses_degree == 0
    if par.tensor_parallel is not None and heads:
        assert heads % par.tensor_parallel.degree == 0
    if par.context_parallel is not None and not device.gpu and facts is not None:
        seq = sequence(facts, workload_of(spec))
        assert seq is not None and seq.lengths.image_tokens % par.context_parallel.degree == 0
    assert len(choice.reasons) >= 1 and all(choice.reasons)
    return choice


def layout(choice: Choice) -> tuple[str, ...]:
    """The choice in a few words: the strategy and its degrees."""
    par = choice.parallelism
    cp, tp = par.get("contextParallel"), par.get("tensorParallel")
    if cp:
        return ("ContextParallel", f"u{cp['ulyssesDegree']}xr{cp['ringDegree']}", cp["attentionBackend"])
    if tp:
        return ("TensorParallel", f"tp{tp['degree']}")
    return (par["strategy"],)


DP, DM = ("DataParallel",), ("DeviceMap",)
CP8 = ("ContextParallel", "u8xr1", "native")
NO = "cannot"
# (model, GiB, link) -> (throughput layout, latency layout); NO: no layout fits (CannotPlan).
TABLE: dict[tuple[str, int, str], tuple[Any, Any]] = {
    **{(SDXL, gib, link): (DP, DP) for gib in PROFILES for link in ("nvlink", "pcie")},  # UNet: no _cp_plan
    (FLUX1, 24, "nvlink"): (("TensorParallel", "tp4"), ("TensorParallel", "tp8")),
    (FLUX1, 24, "pcie"): (NO, NO),
    **{(FLUX1, gib, link): (DP, CP8) for gib in (48, 80, 141) for link in ("nvlink", "pcie")},
    **{(FLUX2, gib, link): (NO, NO) for gib in (24, 48) for link in ("nvlink", "pcie")},
    **{(FLUX2, 80, link): (DM, DM) for link in ("nvlink", "pcie")},
    **{(FLUX2, 141, link): (DP, CP8) for link in ("nvlink", "pcie")},
    **{(QWEN, 24, link): (NO, NO) for link in ("nvlink", "pcie")},
    **{(QWEN, 48, link): (DM, DM) for link in ("nvlink", "pcie")},
    **{(QWEN, gib, link): (DP, CP8) for gib in (80, 141) for link in ("nvlink", "pcie")},
    # 12 heads: Ulysses 8 does not divide them, Ulysses 4 x ring 2 over 8 GPUs does.
    **{(WAN1, gib, link): (DP, ("ContextParallel", "u4xr2", "_native_cudnn"))
       for gib in PROFILES for link in ("nvlink", "pcie")},
    **{(WAN14, 24, link): (NO, NO) for link in ("nvlink", "pcie")},  # no _tp_plan for Wan
    **{(WAN14, gib, link): (DP, CP8) for gib in (48, 80, 141) for link in ("nvlink", "pcie")},
}


@pytest.mark.parametrize(("model", "gib", "link"), list(TABLE), ids=lambda v: str(v).rsplit("/", 1)[-1])
def test_the_table_over_the_public_models_and_device_profiles(public_models: dict[str, Path], model: str, gib: int,
                                                              link: str) -> None:
    facts = read_folder(public_models[model])
    device = Device(8, gib * GIB, link)  # type: ignore[arg-type]
    for objective, expected in zip(("throughput", "latency"), TABLE[model, gib, link], strict=True):
        spec = auto_spec(model, objective=objective)
        if expected == NO:
            with pytest.raises(CannotPlan) as refused:
                decide(facts, device, workload_of(spec), objective)  # type: ignore[arg-type]
            assert refused.value.field.startswith("spec.") and "GiB" in refused.value.message
            continue
        assert layout(check(spec, facts, device)) == expected, (objective, model, gib, link)


def test_each_rule_says_its_figures() -> None:
    flux, wan = known_facts(FLUX1), known_facts(WAN14)
    tp = check(auto_spec(FLUX1, objective="latency"), flux, Device(8, 24 * GIB, "nvlink"))
    assert tp.rules == ["tensor-parallel"]
    assert [r.split(":")[0] for r in tp.reasons] == ["weights", "tensor-parallel", "never-both"]
    assert "22.2 GiB" in tp.reasons[0] and "21.6 GiB usable of 24.0 GiB" in tp.reasons[0]  # transformer, room
    assert "8 divides the 24 heads" in tp.reasons[1]
    dm = check(auto_spec(FLUX2), known_facts(FLUX2), Device(2, 80 * GIB, "pcie"))
    assert dm.parallelism["deviceMap"]["maxMemory"].keys() == {"0", "1"}
    assert "transformer -> GPU 0 (60.0 GiB)" in dm.reasons[-1] and "text_encoder -> GPU 1 (44.7 GiB)" in dm.reasons[-1]
    fits = check(auto_spec(WAN14, objective="latency"), wan, Device(8, 80 * GIB, "nvlink"))
    assert fits.reasons[0].startswith("fits: ") and "32760 tokens" in fits.reasons[0]
    assert "ulysses 8 divides the 40 heads" in fits.reasons[1]


def test_activations_not_weights_call_for_the_least_context_parallel_that_fits() -> None:
    wan = known_facts(WAN14)
    device = Device(8, 48 * GIB, "pcie")
    # 720p, 81 frames: 75,600 tokens; the weights (37.4 GiB) fit 48 GiB, their activations beside them do not.
    throughput = check(auto_spec(WAN14, height=720, width=1280, vaeTiling=True), wan, device)
    assert throughput.rules == ["activations"] and layout(throughput) == ("ContextParallel", "u2xr1", "native")
    assert "the weights fit (37.4 GiB) but not the activations" in throughput.reasons[0]
    latency = check(auto_spec(WAN14, objective="latency", height=720, width=1280, vaeTiling=True), wan, device)
    assert layout(latency) == CP8
    # The decode is every rank's whole: context parallelism cannot split it; tiling can.
    with pytest.raises(CannotPlan) as refused:
        check(auto_spec(WAN14, height=720, width=1280), wan, device)
    assert refused.value.field == "spec.generation.vaeTiling" and "set generation.vaeTiling: true" in str(refused.value)


def test_degrees_divide_the_heads_and_the_devices() -> None:
    flux = known_facts(FLUX1)
    assert flux is not None and flux.denoiser is not None
    # A Flux whose 20 heads 8 does not divide: tensor parallel 4, the largest degree dividing both.
    twenty = dataclasses.replace(flux, components=tuple(
        Component(c.name, c.class_name, c.parameters, c.other_bytes, {**c.config, "num_attention_heads": 20})
        if c is flux.denoiser else c for c in flux.components))
    assert layout(check(auto_spec(FLUX1, objective="latency"), twenty, Device(8, 24 * GIB, "nvlink"))) == \
        ("TensorParallel", "tp4")
    wan = known_facts(WAN1)
    assert layout(check(auto_spec(WAN1, 6, "latency"), wan, Device(6, 80 * GIB, "nvlink"))) == \
        ("ContextParallel", "u6xr1", "native")  # 6 divides the 12 heads
    assert layout(check(auto_spec(WAN1, 1, "latency"), wan, Device(1, 80 * GIB, "none"))) == DP


def test_on_cpu_only_ulysses_with_even_sequences() -> None:
    tiny = known_facts("muralist/tiny-wan")
    # 17 frames at 64 x 64: 5 latent frames x 4 x 4 = 80 tokens, even over 2 processes; 2 heads.
    spec = auto_spec("muralist/tiny-wan", 0, "latency", processes=2, height=64, width=64, numFrames=17)
    cpu = Device(2, 256 << 20, "none", gpu=False)
    chosen = check(spec, tiny, cpu)
    assert layout(chosen) == ("ContextParallel", "u2xr1", "native") and chosen.parallelism["processesPerNode"] == 2
    assert layout(check(auto_spec("muralist/tiny-wan", 0, processes=2, height=64, width=64, numFrames=17),
                        tiny, cpu)) == DP
    # 9 frames at 48 x 48: 3 x 3 x 3 = 27 tokens, which 2 ranks cannot split without GPUs: DataParallel.
    odd = check(auto_spec("muralist/tiny-wan", 0, "latency", processes=2, height=48, width=48, numFrames=9),
                tiny, cpu)
    assert layout(odd) == DP and "no context-parallel degree of 2 divides" in odd.reasons[-1]


def test_what_the_job_rules_out_and_what_is_not_known() -> None:
    flux = known_facts(FLUX1)
    big = Device(8, 80 * GIB, "nvlink")
    batched = check(auto_spec(FLUX1, objective="latency", batchSize=2), flux, big)
    assert layout(batched) == DP and "batchSize is 2" in batched.reasons[-1]
    unknown_memory = check(auto_spec(FLUX1, objective="latency"), flux, Device(8, 0, "pcie", source="no labels"))
    assert unknown_memory.reasons[0].startswith("unknown-memory: ") and layout(unknown_memory) == CP8
    unknown_model = check(auto_spec("someone/custom-model", objective="latency"), None, big)
    assert unknown_model.rules == ["unknown-model"] and layout(unknown_model) == DP
    with pytest.raises(CannotPlan, match="give it more GPUs"):
        decide(flux, Device(1, 24 * GIB, "none"), workload_of(auto_spec(FLUX1, 1)))


def test_a_pod_confirms_the_plan_or_names_what_it_measured() -> None:
    flux = known_facts(FLUX1)
    spec = auto_spec(FLUX1, 4)
    plan = plan_job(spec, flux, Device(4, 80 * GIB, "nvlink"))
    resolved = planned(spec, plan)
    assert confirm_problems(plan, flux, resolved, Measured(79 * GIB)) == []
    short = confirm_problems(plan, flux, resolved, Measured(20 * GIB, what="free memory on GPU 0"))
    assert short and short[0][0] == "spec.parallelism"
    assert "measured 20.0 GiB of free memory on GPU 0 (18.0 GiB usable)" in short[0][1]
    assert "33.9 GiB per device" in short[0][1]
    tp_spec = auto_spec(FLUX1, 8)
    tp = plan_job(tp_spec, flux, Device(8, 24 * GIB, "nvlink"))
    no_peers = confirm_problems(tp, flux, planned(tp_spec, tp), Measured(24 * GIB, peer_access=False))
    assert [p[1].split(",")[0] for p in no_peers] == ["the plan (TensorParallel 4 over 4 GPUs"]
    assert "can_device_access_peer is False" in no_peers[0][1]
