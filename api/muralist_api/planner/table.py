"""The decision table: `strategy: Auto` resolved from the model's facts, the devices and the objective.

The rules, in the order they apply (docs/concepts/strategies.md#how-auto-decides quotes the
sentence of diffusers' distributed-inference guide each one implements, with its threshold):

1. `fits`: the whole pipeline's peak (planner/memory.py) is at most USABLE of one device ->
   **DataParallel** over every device (throughput), or
2. `latency`: with `objective: latency`, a denoiser with a `_cp_plan` and two devices or more ->
   **ContextParallel** over the most devices whose degree the heads and the sequence divide
   (Ulysses first, Ulysses x ring on 4 GPUs or more when the heads limit Ulysses, ring alone last);
3. `activations`: the weights fit but the activations at this size do not -> **ContextParallel**
   with the least degree whose share of the sequence fits (a VAE decode that does not fit is
   `vaeTiling`'s to fix: context parallelism does not split the decode);
4. `device-map`: the weights do not fit together but each component fits alone -> **DeviceMap**
   (whole components on different GPUs, one process per pod);
5. `tensor-parallel`: the denoiser alone does not fit, the GPUs are linked by NVLink and it has a
   `_tp_plan` -> **TensorParallel** with the least degree (throughput) or the most (latency) that fits
   and divides the heads;
6. `never-both`: tensor and context parallel never together (diffusers refuses it);
7. otherwise no layout fits: `CannotPlan`, naming the figures and what would fit.

Every degree divides the devices of a pod (groups never span pods) and passes the same catalog
rules admission and the runtime apply (`catalog.context_parallel_problems`, `sequence.cp_problems`,
`catalog.tensor_parallel_problems`, `catalog.heads_problems`). Pure: the callers read the facts
(planner/facts.py) and the devices (planner/device.py); what a pod confirms of a plan is
planner/confirm.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from muralist_api.job import DiffusionJobSpec, Parallelism
from muralist_api.planner.device import MIB, Device, gib
from muralist_api.planner.facts import ModelFacts
from muralist_api.planner.memory import MemoryEstimate, Workload, estimate, sequence, usable
from muralist_api.planner.record import MemoryFigures, Objective, ParallelPlan
from muralist_api.rules import catalog
from muralist_api.rules.sequence import DEFAULT_TEXT_TOKENS, cp_problems, text_tokens
from muralist_api.step_cache import cache_problems

GUIDE = "https://huggingface.co/docs/diffusers/main/en/training/distributed_inference"
RING_BACKEND = "_native_cudnn"  # ships with PyTorch, returns the LSE ring attention merges with (the guide's)
PLANNED_FIELDS = ("strategy", "gpusPerNode", "processesPerNode", "contextParallel", "tensorParallel", "deviceMap")


class CannotPlan(Exception):
    """No layout fits: the message quotes the figures and says what would."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass
class Choice:
    """A decision: the spec.parallelism chosen, the rules that chose it, why, and its estimate."""

    parallelism: dict[str, Any]
    summary: str
    rules: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    estimate: MemoryEstimate | None = None


def workload_of(spec: DiffusionJobSpec) -> Workload:
    gen = spec.generation
    return Workload(gen.height, gen.width, gen.num_frames, gen.batch_size,
                    text_tokens(gen.extra_args, DEFAULT_TEXT_TOKENS), gen.vae_tiling, spec.model.dtype)


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def _components(facts: ModelFacts, dtype: str) -> str:
    return ", ".join(f"{c.name} {gib(c.bytes_at(dtype))}" for c in facts.components)


def _sequence_words(facts: ModelFacts, work: Workload) -> str:
    seq = sequence(facts, work)
    size = f"{work.height}x{work.width}"
    if seq is None:
        return size
    frames = f", {seq.frames} frames" if seq.frames > 1 else ""
    return f"{size}{frames} ({seq.tokens} tokens)"


def _fits(peak: int, device: Device) -> bool:
    return peak <= usable(device.memory)


def _room(device: Device) -> str:
    return f"{gib(usable(device.memory))} usable of {gib(device.memory)} ({device.describe()})"


# -- context parallel --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cp:
    ring: int
    ulysses: int
    backend: str
    uneven: str

    @property
    def degree(self) -> int:
        return self.ring * self.ulysses

    def words(self) -> str:
        return f"ulysses {self.ulysses} x ring {self.ring}" + (f" ({self.uneven})" if self.uneven else "")


def _cp_options(degree: int, gpu: bool) -> list[tuple[int, int]]:
    """(ring, ulysses) for one degree, best first: Ulysses alone (the guide's lowest latency), then
    Ulysses x ring on 4 GPUs or more, then ring alone (both need a backend with LSE: GPUs only)."""
    options = [(1, degree)]
    if gpu:
        options += [(degree // u, u) for u in sorted(_divisors(degree), reverse=True) if 2 <= u < degree
                    and degree >= 4]
        options.append((degree, 1))
    return options


def _cp_layout(facts: ModelFacts, work: Workload, degree: int, device: Device, nodes: int) -> _Cp | None:
    seq = sequence(facts, work)
    if seq is None:
        return None
    for ring, ulysses in _cp_options(degree, device.gpu):
        backend = "native" if ring == 1 else RING_BACKEND
        if catalog.context_parallel_problems(ring, ulysses, backend, device.count, device.gpu, nodes):
            continue
        verdict = cp_problems(seq.lengths, facts.heads, ring, ulysses, seq.side, allow_uneven=device.gpu)
        if not verdict.problems:
            return _Cp(ring, ulysses, backend, verdict.uneven)
    return None


def _cp_choice(facts: ModelFacts, work: Workload, device: Device, nodes: int, cp: _Cp, rule: str,
               reasons: list[str]) -> Choice:
    weights = facts.total_bytes(work.dtype)
    est = estimate(facts, work, weights, split_sequence=cp.degree)
    section = {"ringDegree": cp.ring, "ulyssesDegree": cp.ulysses, "attentionBackend": cp.backend}
    groups = device.count // cp.degree
    seq = sequence(facts, work)
    tokens = seq.tokens if seq else 0
    divides = (f"ulysses {cp.ulysses} divides the {facts.heads} heads" if cp.ulysses > 1 else "ring attention")
    reasons.append(f"{rule}: context parallel {cp.words()} over {cp.degree} of the pod's {device.count} devices "
                   f"({groups} data-parallel group(s)): {divides} and splits the {tokens} tokens "
                   f"{tokens // cp.degree} per rank; backend {cp.backend}")
    return Choice(_section("ContextParallel", device, contextParallel=section),
                  f"ContextParallel {cp.words()} over {cp.degree} devices, {groups} group(s) per pod", [rule], reasons,
                  est)


# -- the table ---------------------------------------------------------------------------------


def _section(strategy: str, device: Device, **parts: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"strategy": strategy, "gpusPerNode": device.count if device.gpu else 0}
    if not device.gpu:
        section["processesPerNode"] = device.count
    return {**section, **parts}


def _data_parallel(facts: ModelFacts | None, work: Workload, device: Device, rules: list[str],
                   reasons: list[str]) -> Choice:
    est = estimate(facts, work, facts.total_bytes(work.dtype)) if facts is not None else None
    return Choice(_section("DataParallel", device), f"DataParallel over {device.count} device(s) per pod", rules,
                  reasons, est)


def decide(facts: ModelFacts | None, device: Device, work: Workload, objective: Objective = "throughput",
           nodes: int = 1, blocked: Mapping[str, str] | None = None) -> Choice:
    """The table applied; raises CannotPlan when no layout fits. `blocked`: strategies the job's other
    settings rule out, and why (`blocked_by`)."""
    blocked = blocked or {}
    reasons: list[str] = []
    if facts is None:
        reasons.append("unknown-model: the model's sizes are not known here (not in the planner's catalog, files "
                       "not readable); DataParallel, which each pod confirms against the weights' safetensors "
                       "headers before loading (`muralist plan` shows the figures)")
        return _data_parallel(None, work, device, ["unknown-model"], reasons)
    dtype = work.dtype
    weights = facts.total_bytes(dtype)
    whole = estimate(facts, work, weights)
    measured = device.memory > 0
    at = _sequence_words(facts, work)
    if not measured:
        reasons.append(f"unknown-memory: the devices' memory is not known ({device.source or 'no label, no budget'}): "
                       f"memory is not checked here (weights {gib(weights)}: {_components(facts, dtype)}); each pod "
                       "confirms against what it measures")
    if not measured or _fits(whole.peak, device):
        if measured:
            reasons.append(f"fits: the whole pipeline on one device: {whole.describe()} at {at} <= {_room(device)}; "
                           f"weights: {_components(facts, dtype)}")
        if objective == "latency" and device.count >= 2:
            return _latency(facts, work, device, nodes, reasons, blocked)
        why = ("the only strategy whose throughput grows linearly with devices" if device.count > 1 else
               "one device")
        reasons.append(f"throughput: DataParallel: each of the {device.count} device(s) renders its own items "
                       f"({why})" if objective == "throughput" else
                       "latency: one device per pod, so one item cannot be split: DataParallel")
        return _data_parallel(facts, work, device, ["fits"], reasons)
    room = usable(device.memory)
    vae_alone = MemoryEstimate(weights, 0, whole.vae_decode)
    if weights <= room and not _fits(vae_alone.peak, device):
        tiled = estimate(facts, replace(work, vae_tiling=True), weights)
        if not work.vae_tiling and weights + tiled.vae_decode <= room:
            raise CannotPlan("spec.generation.vaeTiling", (
                f"the VAE decode at {at} needs {gib(whole.vae_decode)} beside the weights ({gib(weights)}): "
                f"{gib(vae_alone.peak)} > {_room(device)}; context parallelism does not split the decode, tiling "
                f"does ({gib(tiled.vae_decode)} per tile): set generation.vaeTiling: true"))
        raise CannotPlan("spec.generation.height", (
            f"the VAE decode at {at} needs {gib(whole.vae_decode)} beside the weights ({gib(weights)}), "
            f"over {_room(device)} even tiled; render smaller images or fewer frames, or use devices with more "
            "memory"))
    if weights <= room:
        return _activations(facts, work, device, nodes, whole, objective, reasons, blocked)
    return _weights(facts, work, device, objective, reasons, blocked)


def _latency(facts: ModelFacts, work: Workload, device: Device, nodes: int, reasons: list[str],
             blocked: Mapping[str, str]) -> Choice:
    denoiser = facts.denoiser.class_name if facts.denoiser else "the pipeline"
    if "ContextParallel" in blocked:
        reasons.append(f"latency: {blocked['ContextParallel']}, so one item cannot be split over devices: "
                       "DataParallel")
        return _data_parallel(facts, work, device, ["fits", "latency"], reasons)
    if not facts.cp_plan:
        reasons.append(f"latency: {denoiser} has no _cp_plan in diffusers, so one item cannot be split over "
                       "devices: DataParallel")
        return _data_parallel(facts, work, device, ["fits", "latency"], reasons)
    for degree in sorted(_divisors(device.count), reverse=True):
        cp = _cp_layout(facts, work, degree, device, nodes)
        if cp is not None:
            return _cp_choice(facts, work, device, nodes, cp, "latency", reasons)
    reasons.append(f"latency: no context-parallel degree of {device.count} divides both the {facts.heads} heads and "
                   f"the sequence at {_sequence_words(facts, work)}: DataParallel")
    return _data_parallel(facts, work, device, ["fits", "latency"], reasons)


def _activations(facts: ModelFacts, work: Workload, device: Device, nodes: int, whole: MemoryEstimate,
                 objective: Objective, reasons: list[str], blocked: Mapping[str, str]) -> Choice:
    at = _sequence_words(facts, work)
    reasons.append(f"activations: the weights fit ({gib(whole.weights)}) but not the activations at {at}: "
                   f"{whole.describe()} > {_room(device)}")
    denoiser = facts.denoiser.class_name if facts.denoiser else "the pipeline"
    if not facts.cp_plan:
        raise CannotPlan("spec.generation.height", (
            f"the activations at {at} ({gib(whole.activations)}) do not fit beside the weights ({gib(whole.weights)}) "
            f"on {_room(device)}, and {denoiser} has no _cp_plan to split its sequence; render smaller images or "
            "fewer frames, or use devices with more memory"))
    if "ContextParallel" in blocked:
        raise CannotPlan("spec.generation.height", (
            f"the activations at {at} ({gib(whole.activations)}) do not fit beside the weights ({gib(whole.weights)}) "
            f"on {_room(device)}, and context parallelism, which would split them, is ruled out: "
            f"{blocked['ContextParallel']}"))
    degrees = _divisors(device.count)
    for degree in (sorted(degrees, reverse=True) if objective == "latency" else degrees):
        cp = _cp_layout(facts, work, degree, device, nodes)
        if cp is None:
            continue
        est = estimate(facts, work, whole.weights, split_sequence=degree)
        if _fits(est.peak, device):
            return _cp_choice(facts, work, device, nodes, cp, "activations", reasons)
    raise CannotPlan("spec.generation.height", (
        f"the activations at {at} ({gib(whole.activations)} on one device) do not fit beside the weights "
        f"({gib(whole.weights)}) even split over the pod's {device.count} device(s) with a degree that divides the "
        f"{facts.heads} heads and the sequence, on {_room(device)}; render smaller images or fewer frames, or give "
        "the pod more GPUs"))


def _weights(facts: ModelFacts, work: Workload, device: Device, objective: Objective, reasons: list[str],
             blocked: Mapping[str, str]) -> Choice:
    dtype = work.dtype
    weights = facts.total_bytes(dtype)
    room = usable(device.memory)
    reasons.append(f"weights: the pipeline's weights do not fit on one device: {gib(weights)} "
                   f"({_components(facts, dtype)}) > {_room(device)}")
    denoiser = facts.denoiser
    alone = [(c, estimate(facts, work, c.bytes_at(dtype), denoiser_here=c is denoiser, vae_here=c.name == "vae"))
             for c in facts.components]
    too_big = [(c, e) for c, e in alone if not _fits(e.peak, device)]
    if not device.gpu:
        raise CannotPlan("spec.parallelism", (
            f"the weights ({gib(weights)}) do not fit one process's memory ({_room(device)}); on CPU every process "
            "holds the whole pipeline: give the pod more memory (resources.limits.memory)"))
    if device.count < 2:
        raise CannotPlan("spec.parallelism.gpusPerNode", (
            f"the weights ({gib(weights)}) do not fit one GPU ({_room(device)}), and the pod has one: give it "
            "more GPUs (gpusPerNode) or use GPUs with more memory"))
    if not too_big:
        return _device_map(facts, work, device, reasons)
    big, big_est = too_big[0]
    if big is not denoiser:
        raise CannotPlan("spec.parallelism", (
            f"{big.name} ({big.class_name}) alone needs {gib(big_est.peak)}, over {_room(device)}, and only the "
            "denoiser can be split (tensor parallel): use GPUs with more memory"))
    need = f"{big.name} alone needs {gib(big_est.peak)} ({big_est.describe()}) > {gib(room)}"
    if device.interconnect != "nvlink":
        raise CannotPlan("spec.parallelism", (
            f"{need}: it must be split, and tensor parallelism needs NVLink (these GPUs: {device.describe()}; "
            f"device_map places whole components); use NVLink GPUs or GPUs with at least "
            f"{gib(big_est.peak / 0.9)}"))
    if not facts.tp_plan:
        raise CannotPlan("spec.parallelism", (
            f"{need}, and {big.class_name} has no _tp_plan in diffusers to shard it; use GPUs with at least "
            f"{gib(big_est.peak / 0.9)}"))
    if "TensorParallel" in blocked:
        raise CannotPlan("spec.parallelism", f"{need}, and tensor parallelism, which would shard it, is ruled out: "
                         f"{blocked['TensorParallel']}")
    rest = weights - big.bytes_at(dtype)
    degrees = [d for d in _divisors(device.count)
               if not catalog.heads_problems(facts.heads, d, "tp", big.class_name)
               and not catalog.tensor_parallel_problems(d, device.count, True)]
    for degree in (sorted(degrees, reverse=True) if objective == "latency" else degrees):
        est = estimate(facts, work, big.bytes_at(dtype) // degree + rest, split_tensors=degree)
        if _fits(est.peak, device):
            reasons.append(f"tensor-parallel: {need}; the GPUs are linked by NVLink and {big.class_name} has a "
                           f"_tp_plan: tensor parallel {degree} holds {gib(big.bytes_at(dtype) / degree)} of it per "
                           f"GPU beside the rest ({gib(rest)}): {est.describe()} <= {gib(room)}; {degree} divides "
                           f"the {facts.heads} heads")
            if objective == "latency":
                reasons.append("never-both: tensor and context parallel never on one model (diffusers' ParallelConfig "
                               "refuses both): tensor parallel alone")
            return Choice(_section("TensorParallel", device, tensorParallel={"degree": degree}),
                          f"TensorParallel {degree} over {degree} GPUs, {device.count // degree} group(s) per pod",
                          ["tensor-parallel"], reasons, est)
    raise CannotPlan("spec.parallelism", (
        f"{need}; even sharded over the pod's {device.count} GPUs (degrees dividing the {facts.heads} heads: "
        f"{', '.join(map(str, degrees)) or 'none'}) every GPU also holds the rest of the pipeline ({gib(rest)}): "
        "use GPUs with more memory, or more GPUs per pod"))


@dataclass(frozen=True)
class Placement:
    """Whole components over a pod's GPUs, as device_map="balanced" spreads them: largest first, each
    to the least loaded GPU."""

    placed: tuple[str, ...]
    loads: tuple[int, ...]  # weights per GPU
    extra: tuple[int, ...]  # the activations or decode of what runs on each GPU

    @property
    def worst(self) -> int:
        return max(range(len(self.loads)), key=lambda i: self.loads[i] + self.extra[i])

    def estimate(self) -> MemoryEstimate:
        return MemoryEstimate(self.loads[self.worst], self.extra[self.worst], 0)


def placement(facts: ModelFacts, work: Workload, gpus: int) -> Placement:
    denoiser = facts.denoiser
    loads, extra, placed = [0] * gpus, [0] * gpus, []
    alone = [(c, estimate(facts, work, c.bytes_at(work.dtype), denoiser_here=c is denoiser, vae_here=c.name == "vae"))
             for c in facts.components]
    for component, est in sorted(alone, key=lambda ce: -ce[1].weights):
        gpu = min(range(gpus), key=lambda i: loads[i])
        loads[gpu] += est.weights
        extra[gpu] = max(extra[gpu], est.activations, est.vae_decode)
        placed.append(f"{component.name} -> GPU {gpu} ({gib(est.weights)})")
    return Placement(tuple(placed), tuple(loads), tuple(extra))


def _device_map(facts: ModelFacts, work: Workload, device: Device, reasons: list[str]) -> Choice:
    where = placement(facts, work, device.count)
    est = where.estimate()
    if not _fits(est.peak, device):
        raise CannotPlan("spec.parallelism", (
            f"each component fits a GPU alone, but placed whole over the pod's {device.count} GPUs "
            f"({'; '.join(where.placed)}) GPU {where.worst} needs {gib(est.peak)} > {_room(device)}; give the pod "
            "more GPUs"))
    cap = usable(device.memory) - max(where.extra)
    reasons.append(f"device-map: each component fits one GPU alone but not together: device_map places whole "
                   f"components over the pod's GPUs, one process per pod: {'; '.join(where.placed)}; the fullest GPU "
                   f"peaks at {gib(est.peak)} <= {gib(usable(device.memory))}; maxMemory {gib(cap)} per GPU "
                   "keeps room for the activations")
    max_memory = {str(i): f"{cap // MIB}MiB" for i in range(device.count)}
    return Choice(_section("DeviceMap", device, deviceMap={"policy": "balanced", "maxMemory": max_memory}),
                  f"DeviceMap over {device.count} GPUs, one process per pod", ["device-map"], reasons, est)


# -- the record, and the spec it resolves to ---------------------------------------------------


def blocked_by(spec: DiffusionJobSpec) -> dict[str, str]:
    """The parallel strategies a job's other settings rule out (the rules admission applies to them), and why."""
    out: dict[str, str] = {}
    gen = spec.generation
    if gen.batch_size != 1:
        out["ContextParallel"] = out["TensorParallel"] = (
            f"generation.batchSize is {gen.batch_size}, and a context- or tensor-parallel group renders one item at a "
            "time")
    elif gen.cache is not None and cache_problems(gen.cache.type, {}, "ContextParallel"):
        out["ContextParallel"] = out["TensorParallel"] = (
            f"generation.cache {gen.cache.type} cannot run in a parallel group")
    if "TensorParallel" not in out and spec.model.adapters and not spec.model.fuse_adapters:
        out["TensorParallel"] = "a LoRA must be fused into the layers tensor parallel shards (model.fuseAdapters)"
    return out


def plan_job(spec: DiffusionJobSpec, facts: ModelFacts | None, device: Device) -> ParallelPlan:
    """The plan of an Auto job (raises CannotPlan)."""
    objective: Objective = spec.parallelism.objective or "throughput"
    choice = decide(facts, device, workload_of(spec), objective, spec.parallelism.nodes, blocked_by(spec))
    memory = None
    if choice.estimate is not None:
        e = choice.estimate
        memory = MemoryFigures(weights_bytes=e.weights, activations_bytes=e.activations,
                               vae_decode_bytes=e.vae_decode, peak_bytes=e.peak)
    return ParallelPlan(objective=objective, parallelism=choice.parallelism, summary=choice.summary,
                        reasons=choice.reasons[:32], device=device.describe(),
                        device_memory_bytes=device.memory or None,
                        interconnect=device.interconnect, model_source=facts.source if facts else "",
                        memory=memory)


def planned(spec: DiffusionJobSpec, plan: ParallelPlan) -> DiffusionJobSpec:
    """The spec with its Auto parallelism replaced by the plan's (nodes and the rest kept): what the
    operator renders, `muralist run` hands its processes, and the pods run."""
    mine = spec.parallelism.model_dump(by_alias=True, exclude_none=True)
    kept = {k: v for k, v in mine.items() if k not in (*PLANNED_FIELDS, "objective")}
    parallelism = Parallelism.model_validate({**kept, **plan.parallelism})
    return spec.model_copy(update={"parallelism": parallelism})
