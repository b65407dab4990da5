"""The rules catalog: what Muralist knows about models, attention backends and limits.

Admission (`job.spec_problems`, so `muralist validate`, the operator and the CRD's CEL
messages) and the runtime (the strategies, on the machine) check a layout with the same
functions and the same tables, so they cannot disagree: a layout admission accepts fails in
a pod only for what admission cannot know (the model's own config, the GPUs really there).
The tables are checked against the installed diffusers by tests/unit/api/rules/test_catalog.py.

Each rule returns problems as (field path, message with the fix); empty means fine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from muralist_api.cel import python_rule

Problem = tuple[str, str]

CP_FIELD = "spec.parallelism.contextParallel"
TP_FIELD = "spec.parallelism.tensorParallel"

# -- models ------------------------------------------------------------------------------------

# Built in place by the runtime (random weights), or shipped inside it (tiny-shapes-flux, trained to
# draw the coloured shape its prompt names): no download. Quickstarts, tests, demos.
TINY_MODEL_NAMES = frozenset({"muralist/tiny-flux", "muralist/tiny-shapes-flux", "muralist/tiny-wan",
                              "muralist/tiny-wan-i2v"})


@dataclass(frozen=True)
class ModelLayout:
    """What diffusers can split for one pipeline class."""

    pipeline: str
    transformer: str
    context_parallel: bool
    tensor_parallel: bool


# Pipelines whose support is known without loading anything: admission refuses a layout the
# model cannot run instead of letting the pods crash. Unknown pipelines are checked by the
# runtime at start (a permanent failure).
MODEL_LAYOUTS: dict[str, ModelLayout] = {
    layout.pipeline: layout
    for layout in (
        ModelLayout("FluxPipeline", "FluxTransformer2DModel", True, True),
        ModelLayout("FluxImg2ImgPipeline", "FluxTransformer2DModel", True, True),
        ModelLayout("FluxInpaintPipeline", "FluxTransformer2DModel", True, True),
        ModelLayout("FluxKontextPipeline", "FluxTransformer2DModel", True, True),
        ModelLayout("Flux2Pipeline", "Flux2Transformer2DModel", True, True),
        ModelLayout("QwenImagePipeline", "QwenImageTransformer2DModel", True, True),
        ModelLayout("WanPipeline", "WanTransformer3DModel", True, False),
        ModelLayout("WanImageToVideoPipeline", "WanTransformer3DModel", True, False),
        ModelLayout("LTXPipeline", "LTXVideoTransformer3DModel", True, False),
        ModelLayout("StableDiffusionPipeline", "UNet2DConditionModel", False, False),
        ModelLayout("StableDiffusionXLPipeline", "UNet2DConditionModel", False, False),
        ModelLayout("StableDiffusion3Pipeline", "SD3Transformer2DModel", False, False),
    )
}
# Well-known hub ids, for manifests that leave model.pipeline to auto-detection.
KNOWN_MODEL_PIPELINES: dict[str, str] = {
    "muralist/tiny-flux": "FluxPipeline",
    "muralist/tiny-shapes-flux": "FluxPipeline",
    "muralist/tiny-wan": "WanPipeline",
    "muralist/tiny-wan-i2v": "WanImageToVideoPipeline",
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": "WanPipeline",
    "Wan-AI/Wan2.1-T2V-14B-Diffusers": "WanPipeline",
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": "WanPipeline",
    "Lightricks/LTX-Video": "LTXPipeline",
    "black-forest-labs/FLUX.1-dev": "FluxPipeline",
    "black-forest-labs/FLUX.1-schnell": "FluxPipeline",
    "black-forest-labs/FLUX.1-Krea-dev": "FluxPipeline",
    "black-forest-labs/FLUX.2-dev": "Flux2Pipeline",
    "Qwen/Qwen-Image": "QwenImagePipeline",
    "stable-diffusion-v1-5/stable-diffusion-v1-5": "StableDiffusionPipeline",
    "stabilityai/stable-diffusion-xl-base-1.0": "StableDiffusionXLPipeline",
    "stabilityai/stable-diffusion-3.5-large": "StableDiffusion3Pipeline",
}
# Approximate size of all pipeline weights in 16-bit (GiB), where known. Every rank loads the
# whole pipeline into host memory on its way to the GPU, so pods are sized from this.
KNOWN_MODEL_SIZES_GIB: dict[str, float] = {
    "black-forest-labs/FLUX.1-dev": 32.0,
    "black-forest-labs/FLUX.1-schnell": 32.0,
    "black-forest-labs/FLUX.1-Krea-dev": 32.0,
    "black-forest-labs/FLUX.2-dev": 60.0,
    "Qwen/Qwen-Image": 54.0,
    "stable-diffusion-v1-5/stable-diffusion-v1-5": 2.5,
    "stabilityai/stable-diffusion-xl-base-1.0": 6.5,
    "stabilityai/stable-diffusion-3.5-large": 27.0,
    "muralist/tiny-flux": 0.01,
    "muralist/tiny-shapes-flux": 0.01,
    "muralist/tiny-wan": 0.01,
    "muralist/tiny-wan-i2v": 0.01,
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": 17.0,
    "Wan-AI/Wan2.1-T2V-14B-Diffusers": 65.0,
}


def model_size_gib(name: str, dtype: str) -> float | None:
    """Size of the pipeline's weights at its dtype, when the model is known."""
    size = KNOWN_MODEL_SIZES_GIB.get(name)
    if size is None:
        return None
    return size * (2 if dtype == "float32" else 1)


def known_layout(name: str, pipeline: str | None) -> ModelLayout | None:
    pipeline = pipeline or KNOWN_MODEL_PIPELINES.get(name)
    return MODEL_LAYOUTS.get(pipeline) if pipeline else None


@python_rule(no_cel=(
    "needs the rules catalog's model layouts (which pipeline has a CP / TP plan), which the CRD does not "
    "carry"
))
def plan_problems(strategy: str, layout: ModelLayout | None) -> list[Problem]:
    """A CP/TP strategy on a pipeline known to have no plan for it."""
    if layout is None or strategy not in ("ContextParallel", "TensorParallel"):
        return []
    context = strategy == "ContextParallel"
    if layout.context_parallel if context else layout.tensor_parallel:
        return []
    plan = "_cp_plan" if context else "_tp_plan"
    able = ", ".join(name for name, known in MODEL_LAYOUTS.items()
                     if (known.context_parallel if context else known.tensor_parallel)) or "none"
    return [("spec.parallelism.strategy",
             f"{strategy} needs a transformer with a {plan}, and {layout.pipeline} ({layout.transformer}) "
             f"has none in diffusers; use DataParallel or DeviceMap, or a model whose pipeline supports it "
             f"({able})")]


@python_rule(no_cel="reads the loaded model: the runtime checks it on the machine")
def transformer_plan_problems(strategy: str, transformer_class: str, has_plan: bool) -> list[Problem]:
    """The same rule on a loaded model (any pipeline, known or not)."""
    if has_plan:
        return []
    if strategy == "ContextParallel":
        return [("spec.parallelism.strategy",
                 f"{transformer_class} has no context-parallel plan (_cp_plan) in diffusers; use DataParallel")]
    return [("spec.parallelism.strategy",
             f"{transformer_class} has no tensor-parallel plan (_tp_plan) in diffusers; use DataParallel or "
             "ContextParallel")]


@python_rule(no_cel="reads the model's config (its attention heads): the runtime checks it on the machine")
def heads_problems(heads: int | None, degree: int, field: str, model: str) -> list[Problem]:
    """Ulysses and tensor parallelism split the attention heads: the degree must divide them."""
    if heads is None or degree <= 1 or heads % degree == 0:
        return []
    return [(field, f"{degree} does not divide the {heads} attention heads of {model}; use a divisor of {heads}")]


# -- attention backends ------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionBackend:
    """One diffusers attention backend, as far as a parallel layout cares."""

    name: str
    context_parallel: bool  # registered with supports_context_parallel
    lse: bool  # can return the log-sum-exp that ring attention merges partial results with
    cpu: bool  # runs without a GPU


def _backends(*rows: tuple[str, bool, bool, bool]) -> dict[str, AttentionBackend]:
    return {name: AttentionBackend(name, cp, lse, cpu) for name, cp, lse, cpu in rows}


# (name, context parallel, LSE, CPU) for every AttentionBackendName of diffusers 0.42.
ATTENTION_BACKENDS: dict[str, AttentionBackend] = _backends(
    ("flash", True, True, False),
    ("flash_hub", True, True, False),
    ("flash_varlen", False, True, False),
    ("flash_varlen_hub", True, True, False),
    ("flash_4_hub", False, True, False),
    ("_flash_3", False, True, False),
    ("_flash_varlen_3", False, True, False),
    ("_flash_3_hub", True, True, False),
    ("_flash_3_varlen_hub", True, True, False),
    ("aiter_fa2_hub", False, True, False),
    ("flex", False, True, True),
    ("native", True, False, True),
    ("_native_cudnn", True, True, False),
    ("_native_efficient", False, False, False),
    ("_native_flash", True, True, False),
    ("_native_math", False, False, True),
    ("_native_npu", True, False, False),
    ("_native_xla", False, False, False),
    ("sage", True, True, False),
    ("sage_hub", True, True, False),
    ("sage_blackwell_hub", False, False, False),
    ("sage_varlen", False, False, False),
    ("_sage_qk_int8_pv_fp8_cuda", False, True, False),
    ("_sage_qk_int8_pv_fp8_cuda_sm90", False, True, False),
    ("_sage_qk_int8_pv_fp16_cuda", False, True, False),
    ("_sage_qk_int8_pv_fp16_triton", False, True, False),
    ("xformers", False, False, False),
)


def _names(pick: Callable[[AttentionBackend], bool]) -> str:
    return ", ".join(b.name for b in ATTENTION_BACKENDS.values() if pick(b))


@python_rule()
def backend_problems(name: str, ring: int, gpu: bool) -> list[Problem]:
    """Can a context-parallel group use attention backend `name` here?"""
    field = f"{CP_FIELD}.attentionBackend"
    backend = ATTENTION_BACKENDS.get(name)
    if backend is None:
        return [(field, f"unknown attention backend {name!r}; one of: {', '.join(sorted(ATTENTION_BACKENDS))}")]
    if not backend.context_parallel:
        return [(field, f"{name!r} does not support context parallelism; use one of: "
                 f"{_names(lambda b: b.context_parallel)}")]
    problems: list[Problem] = []
    if not gpu and not backend.cpu:
        problems.append((field, f"{name!r} needs GPUs and this job has none; on CPU use native with "
                         "ulyssesDegree"))
    if ring > 1 and not backend.lse:
        problems.append((field, f"ring attention (ringDegree {ring}) needs a backend that returns LSE and "
                         f"{name!r} does not; use one of {_names(lambda b: b.context_parallel and b.lse)} "
                         "on GPUs, or set ringDegree: 1 and use ulyssesDegree"))
    return problems


# -- degrees -----------------------------------------------------------------------------------


def _divisor_hint(ppn: int, degree: int) -> str:
    divisors = [d for d in range(2, ppn + 1) if ppn % d == 0]
    multiple = degree * max(1, -(-ppn // degree))
    hint = f"use {multiple} processes per node"
    if divisors:
        hint += f" or degree {'/'.join(map(str, divisors))}"
    return hint


@python_rule()
def context_parallel_problems(ring: int, ulysses: int, backend: str, ppn: int, gpu: bool,
                              nodes: int = 1) -> list[Problem]:
    """A ring x ulysses group: at least 2 ranks, inside one pod or over whole pods, on a backend
    that can run it."""
    degree = ring * ulysses
    if degree < 2:
        return [(CP_FIELD, "ringDegree x ulyssesDegree = 1 is plain data parallelism; raise ulyssesDegree or "
                 "ringDegree to 2 or more, or use strategy DataParallel")]
    problems: list[Problem] = []
    if ppn % degree and degree % ppn:
        problems.append((CP_FIELD, f"ringDegree x ulyssesDegree = {degree} must divide processesPerNode = {ppn} "
                         f"(a group inside one pod) or be a multiple of it (a group over whole pods); "
                         f"{_divisor_hint(ppn, degree)}"))
    elif degree > ppn and nodes % (degree // ppn):
        pods = degree // ppn
        problems.append(("spec.parallelism.nodes", f"a group of {degree} ranks spans {pods} pods of {ppn} "
                         f"processes, so nodes must be a multiple of {pods}; it is {nodes}"))
    return problems + backend_problems(backend, ring, gpu)


@python_rule()
def tensor_parallel_problems(degree: int, ppn: int, gpu: bool) -> list[Problem]:
    problems: list[Problem] = []
    if ppn % degree:
        problems.append((f"{TP_FIELD}.degree", f"{degree} must divide processesPerNode = {ppn} (a group stays "
                         f"inside one pod); {_divisor_hint(ppn, degree)}"))
    if not gpu:
        problems.append(("spec.parallelism.gpusPerNode", "TensorParallel needs GPUs (diffusers refuses it on "
                         "device type 'cpu'); set gpusPerNode or use DataParallel / ContextParallel"))
    return problems


# -- sizes -------------------------------------------------------------------------------------

# Pod hostnames are `<job>-<index>`: a DNS label, at most 63 characters.
DNS_LABEL_MAX = 63
# A ConfigMap holds at most 1 MiB (etcd's object limit is 1.5 MiB); the runtime spec carries
# the job's spec plus a few fields the operator resolves (names, paths): keep room for those.
CONFIGMAP_MAX_BYTES = 1_000_000
RUNTIME_SPEC_RESERVE_BYTES = 8_192


@python_rule(no_cel="measures the serialized spec, which CEL cannot")
def spec_size_problems(spec_bytes: int, inline_prompts: int) -> list[Problem]:
    """The job's spec travels to the pods in one ConfigMap: it must fit, prompts included."""
    limit = CONFIGMAP_MAX_BYTES - RUNTIME_SPEC_RESERVE_BYTES
    if spec_bytes <= limit:
        return []
    return [("spec.prompts",
             f"{inline_prompts} inline prompts make a {spec_bytes // 1024} KiB spec, over the {limit // 1024} KiB "
             "that fit in the pods' spec ConfigMap; put them in a file on a volume and use spec.dataset (any "
             "size), or in a ConfigMap under 1 MiB with spec.promptsFrom")]
