"""The DiffusionJob API (`muralist.dev/v1alpha1`): the single source of truth.

Pure pydantic, no torch: the operator imports this module, and so does every pod. The CRD's
schema is generated from these models (`muralist crd`), so each field carries a description
that `kubectl explain` shows.

Rules that need several fields are written twice on purpose: once here in Python (full
messages, used by `muralist validate`, the operator and the runtime) and once as CEL in
`CEL_RULES` for the API server. A test checks that both refuse the same manifests.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

GROUP = "muralist.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DiffusionJob"
PLURAL = "diffusionjobs"
SINGULAR = "diffusionjob"
SHORT_NAMES = ["dj"]

# The runtime exits with this code when retrying cannot help (bad model for the layout,
# unsupported device...). It is sysexits' EX_CONFIG. The operator reads it from the
# termination message, because torchrun replaces a worker's exit code with its own.
PERMANENT_FAILURE_EXIT_CODE = 78
# Environment overrides of the runtime (documented where each is read).
TERMINATION_LOG_ENV = "MURALIST_TERMINATION_LOG"
PROGRESS_LINE_PREFIX = "MURALIST_PROGRESS "
# Kubernetes reads a container's termination message from this file.
TERMINATION_LOG = "/dev/termination-log"
# Pod hostnames are `<job>-<index>`: a DNS label, at most 63 characters.
DNS_LABEL_MAX = 63
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Environment variables the pod contract owns; a user env var with one of these names is refused.
RESERVED_ENV_PREFIXES = ("PET_", "MURALIST_")
RESERVED_ENV_NAMES = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "HF_TOKEN"}
)


class Strategy(StrEnum):
    DATA_PARALLEL = "DataParallel"
    DEVICE_MAP = "DeviceMap"
    CONTEXT_PARALLEL = "ContextParallel"
    TENSOR_PARALLEL = "TensorParallel"


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class ApiModel(BaseModel):
    """camelCase on the wire, unknown fields refused, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as it appears in a manifest (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# A Kubernetes object we pass through untouched (VolumeSource, Affinity, ...): the API server
# and kubelet validate those, and their schemas are far too large to copy into our CRD.
KubeObject = Annotated[dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})]


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, description="Name of the Secret in the job's namespace.")
    key: str = Field(min_length=1, description="Key inside the Secret.")


class ConfigMapKeyRef(ApiModel):
    name: str = Field(min_length=1, description="Name of the ConfigMap in the job's namespace.")
    key: str = Field(min_length=1, description="Key inside the ConfigMap; one prompt per line.")


class ModelLoading(ApiModel):
    stage: bool = Field(
        False,
        description="Copy the model directory (a local path, or the hub snapshot once "
        "downloaded) to node-local disk (MURALIST_STAGE_DIR, an emptyDir) before loading, once "
        "per node; later restarts on that node skip the copy. Helps when the cache is a slow "
        "network volume read by several processes.",
    )
    no_mmap: bool = Field(
        False,
        description="Read safetensors files whole instead of memory-mapping them (diffusers "
        "disable_mmap); faster on network filesystems where mmap page faults are slow.",
    )


class ModelSpec(ApiModel):
    name: str = Field(
        min_length=1,
        max_length=1024,
        description=(
            "Hugging Face hub repo id (org/name), an absolute path inside the pod, or a "
            "built-in tiny random pipeline ('muralist/tiny-flux') built in place without "
            "download, for quickstarts and tests."
        ),
    )
    revision: str | None = Field(None, max_length=256, description="Hub revision (branch, tag or commit).")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "bfloat16", description="Weights and compute dtype: float32, float16 or bfloat16."
    )
    pipeline: str | None = Field(
        None,
        description="diffusers pipeline class (e.g. FluxPipeline); default: DiffusionPipeline "
        "auto-detects it from model_index.json.",
    )
    token_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding a hub token; reaches the pod only as HF_TOKEN."
    )
    cache: KubeObject | None = Field(
        None,
        description="A Kubernetes VolumeSource mounted as the Hugging Face cache (HF_HOME), "
        "e.g. {persistentVolumeClaim: {claimName: hf-cache}}.",
    )
    loading: ModelLoading | None = Field(
        None, description="How the weights are read at start (node-local staging, mmap)."
    )


TINY_MODEL_NAMES = frozenset({"muralist/tiny-flux"})


class PromptSpec(ApiModel):
    text: str = Field(min_length=1, description="The prompt.")
    negative_prompt: str | None = Field(None, description="Negative prompt, for pipelines that take one.")
    seed: int | None = Field(None, ge=0, description="This prompt's seed; image i of the prompt uses seed + i.")


class PromptsFrom(ApiModel):
    config_map_key_ref: ConfigMapKeyRef = Field(
        description="A ConfigMap key with one prompt per line (blank lines ignored)."
    )


class Generation(ApiModel):
    steps: int = Field(28, ge=1, le=1000, description="Denoising steps per image.")
    guidance_scale: float = Field(3.5, ge=0, description="Classifier-free / distilled guidance.")
    height: int = Field(
        1024, ge=8, le=16384, multiple_of=8, description="Image height in pixels (multiple of 8; some models need 16)."
    )
    width: int = Field(
        1024, ge=8, le=16384, multiple_of=8, description="Image width in pixels (multiple of 8; some models need 16)."
    )
    images_per_prompt: int = Field(1, ge=1, le=10000, description="Images rendered for each prompt.")
    seed: int = Field(0, ge=0, description="Base seed; see the determinism rule in the README.")
    batch_size: int = Field(1, ge=1, le=256, description="Images per pipeline call in one data-parallel group.")
    extra_args: KubeObject = Field(
        default_factory=dict,
        description="Free-form keyword arguments passed to the pipeline call.",
    )
    vae_tiling: bool = Field(
        False,
        description="Decode latents tile by tile (diffusers vae.enable_tiling) so large images do not "
        "run out of memory at the last step; every rank of a group decodes the same way.",
    )
    compile: bool = Field(
        False,
        description="torch.compile the transformer's repeated blocks (regional compile) and "
        "warm up once before timing; GPU only (ignored with a log line on CPU). Pays minutes of "
        "compile time at start for faster steps; worth it for long jobs at one resolution.",
    )


class ContextParallelSpec(ApiModel):
    ring_degree: int = Field(
        1, ge=1, description="Ring attention degree (needs an attention backend that returns LSE, GPU only)."
    )
    ulysses_degree: int = Field(1, ge=1, description="Ulysses (all-to-all) degree; attention heads must divide by it.")
    attention_backend: str = Field(
        "native",
        pattern=r"^[a-z_0-9]+$",
        max_length=64,
        description="diffusers attention backend (native, flash, _native_cudnn, ...); ring "
        "attention needs one that returns LSE, e.g. flash.",
    )

    @property
    def degree(self) -> int:
        return self.ring_degree * self.ulysses_degree


class TensorParallelSpec(ApiModel):
    degree: int = Field(2, ge=2, description="Tensor-parallel degree (ranks sharing each layer).")


class DeviceMapSpec(ApiModel):
    policy: Literal["balanced"] = Field("balanced", description="diffusers pipeline device_map policy.")
    max_memory: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Per-device memory cap, e.g. {'0': '20GiB', '1': '20GiB'}.",
    )


class Parallelism(ApiModel):
    strategy: Strategy = Field(
        Strategy.DATA_PARALLEL,
        description="DataParallel | DeviceMap | ContextParallel | TensorParallel.",
    )
    nodes: int = Field(1, ge=1, le=1024, description="Pods (torchrun agents), one per node.")
    gpus_per_node: int = Field(1, ge=0, le=64, description="GPUs per pod; 0 runs on CPU.")
    processes_per_node: int | None = Field(
        None,
        ge=1,
        le=64,
        description="torchrun --nproc-per-node; default gpusPerNode, or 1 on CPU and for DeviceMap.",
    )
    launcher: Literal["torchrun", "accelerate"] = Field(
        "torchrun", description="Process launcher inside each pod: torchrun or accelerate."
    )
    context_parallel: ContextParallelSpec | None = Field(
        None, description="ContextParallel layout (ring x ulysses ranks per group)."
    )
    tensor_parallel: TensorParallelSpec | None = Field(None, description="TensorParallel layout.")
    device_map: DeviceMapSpec | None = Field(None, description="DeviceMap placement.")
    collective_timeout_seconds: int = Field(
        600,
        ge=10,
        description="Timeout of one collective (rendezvous excluded): a dead or stuck rank "
        "fails its group after this instead of holding the GPUs.",
    )
    verify: bool = Field(
        False,
        description="Consistency canary for ContextParallel / TensorParallel: before the job, "
        "each group renders the first image (at most 2 steps) in its parallel layout and on one "
        "rank, and the run fails permanently when they differ beyond rounding.",
    )

    @property
    def resolved_processes_per_node(self) -> int:
        if self.processes_per_node is not None:
            return self.processes_per_node
        if self.strategy == Strategy.DEVICE_MAP or self.gpus_per_node == 0:
            return 1
        return self.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.resolved_processes_per_node

    @property
    def group_size(self) -> int:
        """Ranks that render one image together (1 for DataParallel and DeviceMap)."""
        if self.strategy == Strategy.CONTEXT_PARALLEL:
            return (self.context_parallel or ContextParallelSpec()).degree
        if self.strategy == Strategy.TENSOR_PARALLEL:
            return (self.tensor_parallel or TensorParallelSpec()).degree
        return 1

    @property
    def data_parallel_degree(self) -> int:
        return self.world_size // self.group_size


class Output(ApiModel):
    volume: KubeObject | None = Field(
        None,
        description="A Kubernetes VolumeSource for the results (e.g. a PVC); default an emptyDir.",
    )
    path: str | None = Field(
        None,
        max_length=1024,
        description="Directory inside the volume, relative, without '..'; default metadata.name.",
    )
    format: Literal["png", "jpeg", "webp"] = Field("png", description="Image file format.")

    @field_validator("path")
    @classmethod
    def _relative_inside_volume(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value.startswith("/"):
            raise ValueError(
                f"'{value}' is absolute; use a path relative to the volume, e.g. '{value.strip('/') or 'results'}'"
            )
        if ".." in value.split("/"):
            raise ValueError(f"'{value}' contains '..'; it must stay inside the volume")
        if not value.strip("/"):
            raise ValueError("must not be empty; leave it out to use metadata.name")
        return value


class EnvVar(ApiModel):
    name: str = Field(
        min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Variable name."
    )
    value: str | None = Field(None, description="Literal value.")
    value_from: KubeObject | None = Field(None, description="A Kubernetes EnvVarSource (secretKeyRef, fieldRef, ...).")


class PodTemplate(ApiModel):
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[KubeObject] = Field(default_factory=list, description="Pod tolerations.")
    affinity: KubeObject | None = Field(None, description="Pod affinity.")
    priority_class_name: str | None = Field(None, description="Pod priorityClassName.")
    scheduler_name: str | None = Field(None, description="Pod schedulerName (e.g. a gang scheduler).")
    service_account_name: str | None = Field(
        None, description="ServiceAccount for the pods; default the job's own runtime account."
    )
    image_pull_secrets: list[KubeObject] = Field(
        default_factory=list, description="Pod imagePullSecrets ([{name: ...}])."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=200,
        description="Extra container env vars; PET_*, MURALIST_* and torchrun's names are reserved.",
    )

    @field_validator("env")
    @classmethod
    def _no_contract_clash(cls, env: list[EnvVar]) -> list[EnvVar]:
        for i, var in enumerate(env):
            if var.name in RESERVED_ENV_NAMES or var.name.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(
                    f"env[{i}] '{var.name}' is set by Muralist (torchrun contract / HF token); "
                    "rename or remove it (use model.tokenSecret for HF_TOKEN)"
                )
        return env


class RunPolicy(ApiModel):
    max_restarts: int = Field(3, ge=0, le=100, description="Times the pod group is recreated after a failure.")
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="Fail the job (DeadlineExceeded) after this many seconds."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the finished DiffusionJob after this many seconds."
    )
    suspend: bool = Field(False, description="Suspend: delete running pods, keep outputs.")
    queue_name: str | None = Field(
        None, description="Kueue LocalQueue; the Job is created suspended for Kueue to admit."
    )
    stall_timeout_seconds: int | None = Field(
        None,
        ge=10,
        description="Restart the group (reason Stalled) when no progress is reported for this long.",
    )


class DiffusionJobSpec(ApiModel):
    model: ModelSpec = Field(description="The diffusion model to load.")
    prompts: list[str | PromptSpec] = Field(
        default_factory=list,
        max_length=50_000,
        description="Prompts: strings or {text, negativePrompt, seed}.",
    )
    prompts_from: PromptsFrom | None = Field(None, description="More prompts from a ConfigMap (one per line).")
    generation: Generation = Field(default_factory=Generation, description="Sampling parameters.")
    parallelism: Parallelism = Field(
        default_factory=Parallelism, description="How the work is split over pods, processes and GPUs."
    )
    output: Output = Field(default_factory=Output, description="Where images are written.")
    image: str = Field("", description="Runtime container image; default from the operator settings.")
    resources: KubeObject = Field(
        default_factory=dict,
        description="Container resources; default requests/limits nvidia.com/gpu = gpusPerNode.",
    )
    pod_template: PodTemplate = Field(default_factory=PodTemplate, description="Pod scheduling and metadata.")
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy, description="Restarts, deadlines, suspension and queueing."
    )

    @field_validator("prompts")
    @classmethod
    def _prompts_as_objects(cls, prompts: list[str | PromptSpec]) -> list[str | PromptSpec]:
        for i, p in enumerate(prompts):
            if isinstance(p, str) and not p.strip():
                raise ValueError(f"prompts[{i}] is empty; remove it or write a prompt")
        return prompts

    @property
    def prompt_objects(self) -> list[PromptSpec]:
        return [PromptSpec(text=p) if isinstance(p, str) else p for p in self.prompts]

    @model_validator(mode="after")
    def _cross_field_rules(self) -> DiffusionJobSpec:
        problems = [msg for _path, msg in spec_problems(self)]
        if problems:
            raise ValueError("\n".join(problems))
        return self


def spec_problems(spec: DiffusionJobSpec) -> list[tuple[str, str]]:
    """Cross-field rules: (field path, message with the fix). Empty when the spec is valid."""
    out: list[tuple[str, str]] = []
    par = spec.parallelism
    ppn = par.resolved_processes_per_node

    def add(path: str, message: str) -> None:
        out.append((path, f"spec.{path}: {message}"))

    if not spec.prompts and spec.prompts_from is None:
        add("prompts", "no prompts; add at least one to prompts or set promptsFrom")
    if par.context_parallel is not None and par.tensor_parallel is not None:
        add(
            "parallelism",
            "contextParallel and tensorParallel cannot both be set (diffusers' ParallelConfig "
            "refuses it); keep the one that matches strategy",
        )
    for field, strategy in (
        ("context_parallel", Strategy.CONTEXT_PARALLEL),
        ("tensor_parallel", Strategy.TENSOR_PARALLEL),
        ("device_map", Strategy.DEVICE_MAP),
    ):
        if getattr(par, field) is not None and par.strategy != strategy:
            add(
                f"parallelism.{to_camel(field)}",
                f"is only used by strategy {strategy.value}, but strategy is {par.strategy}; "
                f"remove it or set strategy: {strategy.value}",
            )
    if par.strategy == Strategy.DEVICE_MAP and par.processes_per_node not in (None, 1):
        add(
            "parallelism.processesPerNode",
            f"is {par.processes_per_node}, but DeviceMap runs one process per pod over all its "
            "GPUs: set processesPerNode: 1 (or leave it out) and use nodes for replicas",
        )
    elif par.gpus_per_node > 0 and par.processes_per_node not in (None, par.gpus_per_node):
        add(
            "parallelism.processesPerNode",
            f"is {par.processes_per_node} but gpusPerNode is {par.gpus_per_node}; with GPUs it "
            f"is one process per GPU: set processesPerNode: {par.gpus_per_node} or leave it out",
        )
    if par.strategy == Strategy.CONTEXT_PARALLEL:
        cp = par.context_parallel or ContextParallelSpec()
        if cp.degree < 2:
            add(
                "parallelism.contextParallel",
                "ringDegree x ulyssesDegree = 1 is plain data parallelism; raise ulyssesDegree "
                "or ringDegree to 2 or more, or use strategy DataParallel",
            )
        elif ppn % cp.degree:
            add(
                "parallelism.contextParallel",
                f"ringDegree x ulyssesDegree = {cp.degree} must divide processesPerNode = {ppn} "
                f"(a group stays inside one pod); {_divisor_hint(ppn, cp.degree)}",
            )
        if cp.ring_degree > 1 and cp.attention_backend == "native":
            add(
                "parallelism.contextParallel.attentionBackend",
                "ring attention (ringDegree > 1) needs a backend that returns LSE, which "
                "'native' does not; use flash or _native_cudnn on GPUs, or set ringDegree: 1 "
                "and use ulyssesDegree",
            )
    if par.strategy == Strategy.TENSOR_PARALLEL:
        tp = par.tensor_parallel or TensorParallelSpec()
        if ppn % tp.degree:
            add(
                "parallelism.tensorParallel.degree",
                f"{tp.degree} must divide processesPerNode = {ppn} (a group stays inside one "
                f"pod); {_divisor_hint(ppn, tp.degree)}",
            )
        if par.gpus_per_node == 0:
            add(
                "parallelism.gpusPerNode",
                "TensorParallel needs GPUs (diffusers refuses it on CPU); set gpusPerNode or "
                "use DataParallel / ContextParallel",
            )
    if par.strategy in (Strategy.CONTEXT_PARALLEL, Strategy.TENSOR_PARALLEL) and spec.generation.batch_size != 1:
        add(
            "generation.batchSize",
            f"is {spec.generation.batch_size}, but a {par.strategy} group renders one image at "
            "a time (batched context parallelism is broken in several models); set batchSize: 1",
        )
    if par.strategy in (Strategy.CONTEXT_PARALLEL, Strategy.TENSOR_PARALLEL):
        layout = known_layout(spec.model)
        supported = layout and (
            layout.context_parallel if par.strategy == Strategy.CONTEXT_PARALLEL else layout.tensor_parallel
        )
        if layout is not None and not supported:
            plan = "_cp_plan" if par.strategy == Strategy.CONTEXT_PARALLEL else "_tp_plan"
            able = ", ".join(layout_names(par.strategy)) or "none"
            add(
                "parallelism.strategy",
                f"{par.strategy} needs a transformer with a {plan}, and {layout.pipeline} "
                f"({layout.transformer}) has none in diffusers; use DataParallel or DeviceMap, or a "
                f"model whose pipeline supports it ({able})",
            )
    return out


@dataclass(frozen=True)
class ModelLayout:
    """What diffusers can split for one pipeline class (checked against diffusers in the tests)."""

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
        ModelLayout("Flux2Pipeline", "Flux2Transformer2DModel", True, True),
        ModelLayout("QwenImagePipeline", "QwenImageTransformer2DModel", True, True),
        ModelLayout("WanPipeline", "WanTransformer3DModel", True, False),
        ModelLayout("LTXPipeline", "LTXVideoTransformer3DModel", True, False),
        ModelLayout("StableDiffusionPipeline", "UNet2DConditionModel", False, False),
        ModelLayout("StableDiffusionXLPipeline", "UNet2DConditionModel", False, False),
        ModelLayout("StableDiffusion3Pipeline", "SD3Transformer2DModel", False, False),
    )
}
# Well-known hub ids, for manifests that leave model.pipeline to auto-detection.
KNOWN_MODEL_PIPELINES: dict[str, str] = {
    "muralist/tiny-flux": "FluxPipeline",
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
}


def model_size_gib(model: ModelSpec) -> float | None:
    """Size of the pipeline's weights at its dtype, when the model is known."""
    size = KNOWN_MODEL_SIZES_GIB.get(model.name)
    if size is None:
        return None
    return size * (2 if model.dtype == "float32" else 1)


def known_layout(model: ModelSpec) -> ModelLayout | None:
    pipeline = model.pipeline or KNOWN_MODEL_PIPELINES.get(model.name)
    return MODEL_LAYOUTS.get(pipeline) if pipeline else None


def layout_names(strategy: str) -> list[str]:
    return [
        name
        for name, layout in MODEL_LAYOUTS.items()
        if (layout.context_parallel if strategy == Strategy.CONTEXT_PARALLEL else layout.tensor_parallel)
    ]


def _divisor_hint(ppn: int, degree: int) -> str:
    divisors = [d for d in range(2, ppn + 1) if ppn % d == 0]
    multiple = degree * max(1, -(-ppn // degree))
    hint = f"use {multiple} processes per node"
    if divisors:
        hint += f" or degree {'/'.join(map(str, divisors))}"
    return hint


class ObjectMeta(BaseModel):
    """The few metadata fields Muralist reads; the rest passes through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(description="Job name: a DNS label short enough for `<name>-<index>`.")
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None


class Progress(ApiModel):
    summary: str = Field("", description="completed/total, for `kubectl get dj`.")
    total: int = Field(0, description="Images the job renders in all.")
    completed: int = Field(0, description="Images on the volume (including ones kept from before a restart).")
    failed: int = Field(0, description="Images that could not be rendered.")


class Condition(ApiModel):
    type: str = Field(description="Created, Running, Restarting, Suspended, Complete, Failed or Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field("", description="CamelCase reason.")
    message: str = Field("", description="Human readable detail.")
    last_transition_time: str | None = Field(None, description="When status last changed.")
    observed_generation: int | None = Field(None, description="Generation this condition was computed for.")


class DiffusionJobStatus(ApiModel):
    phase: Phase = Field(Phase.PENDING, description="Pending | Running | Restarting | Suspended | Succeeded | Failed.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions (kstatus reads Ready).")
    observed_generation: int | None = Field(None, description="metadata.generation last reconciled.")
    world_size: int | None = Field(None, description="nodes x processesPerNode.")
    data_parallel_degree: int | None = Field(None, description="Groups rendering different images.")
    progress: Progress = Field(default_factory=Progress, description="Images done out of total.")
    restarts: int = Field(0, description="Times the pod group was recreated.")
    start_time: str | None = Field(None, description="When the first pod group started.")
    completion_time: str | None = Field(None, description="When the job finished.")
    last_progress_time: str | None = Field(None, description="When progress last advanced (stall detection).")
    output_path: str = Field("", description="Where the images are, inside the output volume.")
    message: str = Field("", description="Why the job is in its phase.")


class DiffusionJob(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["muralist.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["DiffusionJob"]
    metadata: ObjectMeta
    spec: DiffusionJobSpec
    status: DiffusionJobStatus | None = None

    @property
    def output_path(self) -> str:
        return (self.spec.output.path or self.metadata.name).strip("/")

    @property
    def total_images(self) -> int | None:
        """Known only when every prompt is inline (promptsFrom is read inside the pod)."""
        if self.spec.prompts_from is not None:
            return None
        return len(self.spec.prompts) * self.spec.generation.images_per_prompt


def name_problem(name: str, nodes: int) -> str | None:
    if not DNS_1035_LABEL.match(name):
        return (
            f"metadata.name: '{name}' must be a DNS label (lowercase letters, digits, '-', "
            "starting with a letter) because it names the headless Service and pod hostnames"
        )
    longest = f"{name}-{nodes - 1}"
    if len(longest) > DNS_LABEL_MAX:
        keep = DNS_LABEL_MAX - len(f"-{nodes - 1}")
        return (
            f"metadata.name: '{name}' is {len(name)} characters; pod hostname '{longest}' would "
            f"exceed {DNS_LABEL_MAX}: use at most {keep} characters"
        )
    return None


class PermanentFailure(Exception):
    """What retrying cannot fix (bad model for the layout, unsupported device...).

    The runtime ends with PERMANENT_FAILURE_EXIT_CODE and `str(self)`, a one-line message
    that starts with the spec field to change.
    """

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class ValidationProblem(Exception):
    """A manifest that is not a valid DiffusionJob; `problems` each name a field."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("str", "PromptSpec") or item.startswith(("function-", "union[")):
            continue  # pydantic's union-branch markers are noise for a user
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _describe_error(err: dict[str, Any]) -> list[str]:
    path = _loc_to_path(err["loc"])
    msg: str = err["msg"]
    if err["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
        if msg.startswith(("spec.", "metadata.")):
            return msg.split("\n")
        return [f"{path}: {msg}"]
    if err["type"] == "extra_forbidden":
        return [f"{path}: unknown field; check its spelling against `kubectl explain dj.{path.rsplit('.', 1)[0]}`"]
    if err["type"] == "missing":
        return [f"{path}: required field is missing"]
    if err["type"] in ("literal_error", "enum"):
        return [f"{path}: got {err.get('input')!r}; {msg.lower()}"]
    got = err.get("input")
    if got is not None and not isinstance(got, dict | list):
        return [f"{path}: {msg} (got {got!r})"]
    return [f"{path}: {msg}"]


def problems_from(error: ValidationError) -> list[str]:
    """Pydantic errors as one line per problem, each starting with its field path."""
    out: list[str] = []
    for err in error.errors(include_url=False):
        for line in _describe_error(dict(err)):
            if line not in out:
                out.append(line)
    return out


def parse_job(manifest: Any) -> DiffusionJob:
    """Validate a manifest (a dict from YAML) or raise ValidationProblem naming every field."""
    if not isinstance(manifest, dict):
        raise ValidationProblem([f"manifest: expected a mapping, got {type(manifest).__name__}"])
    problems: list[str] = []
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        raise ValidationProblem(
            [
                f"apiVersion/kind: got {manifest.get('apiVersion')!r}/{manifest.get('kind')!r}; "
                f"expected {API_VERSION}/{KIND}"
            ]
        )
    problems: list[str] = []
    name = (manifest.get("metadata") or {}).get("name")
    nodes = ((manifest.get("spec") or {}).get("parallelism") or {}).get("nodes", 1)
    if isinstance(name, str):
        problem = name_problem(name, nodes if isinstance(nodes, int) and nodes >= 1 else 1)
        if problem:
            problems.append(problem)
    try:
        job = DiffusionJob.model_validate(manifest)
    except ValidationError as e:
        problems.extend(problems_from(e))
        raise ValidationProblem(problems) from None
    if problems:
        raise ValidationProblem(problems)
    return job


# ---------------------------------------------------------------------------------------------
# The runtime spec: what the operator writes into the `<job>-spec` ConfigMap, and what
# `muralist run` hands to each local process. Everything resolved, nothing left to look up.


class RuntimeSpec(ApiModel):
    name: str = Field(description="The DiffusionJob's name.")
    namespace: str = Field("default", description="The DiffusionJob's namespace.")
    spec: DiffusionJobSpec
    output_dir: str = Field(description="Absolute directory the images go to.")
    prompts_file: str | None = Field(None, description="A mounted file with one prompt per line (from promptsFrom).")
    model_path: str | None = Field(
        None, description="Overrides spec.model.name with a local directory (muralist run --model)."
    )

    SCHEMA_VERSION: ClassVar[int] = 1


# ---------------------------------------------------------------------------------------------
# Work items and determinism: pure functions shared by the runtime and the operator's counts.


class ImageTask(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_index: int
    image_index: int
    prompt: str
    negative_prompt: str | None
    seed: int

    @property
    def key(self) -> str:
        return f"{self.prompt_index:05d}-{self.image_index:03d}"


def image_seed(
    base_seed: int, prompt_seed: int | None, prompt_index: int, image_index: int, images_per_prompt: int
) -> int:
    """An image's seed depends only on the seeds and its indices, never on the world layout.

    A prompt with its own seed renders image i with seed + i, like a plain diffusers call with
    that seed. Otherwise images are numbered through the job from the base seed.
    """
    if prompt_seed is not None:
        return prompt_seed + image_index
    return base_seed + prompt_index * images_per_prompt + image_index


def image_tasks(prompts: list[PromptSpec], generation: Generation) -> list[ImageTask]:
    return [
        ImageTask(
            prompt_index=p,
            image_index=i,
            prompt=prompt.text,
            negative_prompt=prompt.negative_prompt,
            seed=image_seed(generation.seed, prompt.seed, p, i, generation.images_per_prompt),
        )
        for p, prompt in enumerate(prompts)
        for i in range(generation.images_per_prompt)
    ]


def spec_digest(spec: DiffusionJobSpec) -> str:
    """Identifies the parameters that decide an image's pixels (used to refuse mixing outputs)."""
    relevant = {
        "model": spec.model.model_dump(mode="json", include={"name", "revision", "dtype", "pipeline"}),
        "generation": spec.generation.model_dump(mode="json", exclude={"batch_size", "compile"}),
    }
    return hashlib.sha256(repr(sorted(relevant.items())).encode()).hexdigest()[:16]
