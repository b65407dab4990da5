"""The DiffusionJob API types (`muralist.dev/v1alpha1`): the single source of truth.

Pure pydantic, no torch: the operator imports this module, and so does every pod. The CRD's
schema is generated from these models (`muralist crd`), so each field carries a description
that `kubectl explain` shows. Rules that need several fields live in `problems.py` (with the
facts they use in `catalog.py`); the CRD's CEL rules mirror them (operator/crd.py).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from muralist_api.base import ApiModel, KubeObject, relative_path
from muralist_api.data import Dataset, Inputs, PromptsFrom, PromptSpec
from muralist_api.options import Adapter, CacheSpec, SchedulerSpec
from muralist_api.pods import PodTemplate, RunPolicy
from muralist_api.status import DiffusionJobStatus

GROUP = "muralist.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DiffusionJob"
PLURAL = "diffusionjobs"
SINGULAR = "diffusionjob"
SHORT_NAMES = ["dj"]


class Strategy(StrEnum):
    DATA_PARALLEL = "DataParallel"
    DEVICE_MAP = "DeviceMap"
    CONTEXT_PARALLEL = "ContextParallel"
    TENSOR_PARALLEL = "TensorParallel"




class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, description="Name of the Secret in the job's namespace.")
    key: str = Field(min_length=1, description="Key inside the Secret.")


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
    adapters: list[Adapter] = Field(
        default_factory=list, max_length=16,
        description="LoRA adapters applied on top of the model, each with its scale (several at once).",
    )
    fuse_adapters: bool = Field(
        False,
        description="Merge the adapters into the base weights after loading (faster steps, and needed with "
        "TensorParallel, which shards the base layers).",
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
    num_frames: int | None = Field(
        None, ge=1, le=1025,
        description="Frames per video (video pipelines; Wan needs 4k+1, e.g. 81); default the pipeline's.",
    )
    fps: int = Field(16, ge=1, le=120, description="Frames per second of video outputs.")
    scheduler: SchedulerSpec | None = Field(None, description="Another scheduler than the pipeline's own.")
    cache: CacheSpec | None = Field(None, description="A step cache (diffusers cache hooks) for faster steps.")


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
        "fails its group after this instead of holding the GPUs. Also the least time a pod may "
        "make no progress before it is retried (runPolicy.stallTimeoutSeconds' default), and the least "
        "time the first pod waits for the other pods' work with no chunk finished before it gives up "
        "the merge and is retried.",
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
    format: Literal["png", "jpeg", "webp", "mp4", "gif"] = Field(
        "png",
        description="png | jpeg | webp for images; mp4 (H.264, yuv420p), webp (animated, lossless) or gif for "
        "videos.",
    )

    layout: Literal["files", "webdataset"] = Field(
        "files",
        description="files: images/<key>.<format> with a JSON file each; webdataset: tar shards of shardSize "
        "rows (image and JSON members per item) with a Parquet index of every item.",
    )
    shard_size: int = Field(
        1000, ge=1, le=100_000,
        description="Rows per WebDataset shard (each row's imagesPerPrompt images go in the same shard).",
    )
    gallery_page_size: int = Field(200, ge=1, le=10_000, description="Items per gallery page.")

    @field_validator("path")
    @classmethod
    def _relative_inside_volume(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.strip("/") and not value.startswith("/"):
            raise ValueError("must not be empty; leave it out to use metadata.name")
        return relative_path(value)


class NetworkPolicySpec(ApiModel):
    enabled: bool | None = Field(
        None,
        description="Give the job a NetworkPolicy that lets only its own pods connect to its pods: to the "
        "work-claim store on the first pod, the rendezvous of worlds that span pods and their process groups "
        "(outgoing traffic stays open). Default: the operator's setting (on unless the Helm chart's "
        "networkPolicies.jobs is false). Enforced only where the cluster's network plugin enforces "
        "NetworkPolicies (Calico, Cilium, ...).",
    )


class DiffusionJobSpec(ApiModel):
    model: ModelSpec = Field(description="The diffusion model to load.")
    prompts: list[str | PromptSpec] = Field(
        default_factory=list,
        max_length=50_000,
        description="Prompts: strings or {text, negativePrompt, seed}.",
    )
    prompts_from: PromptsFrom | None = Field(None, description="More prompts from a ConfigMap (one per line).")
    dataset: Dataset | None = Field(
        None,
        description="Rows from files on a volume (JSON Lines, CSV, Parquet, text, a saved datasets dataset), for "
        "jobs of 10^5-10^7 items; instead of prompts and promptsFrom.",
    )
    inputs: Inputs | None = Field(None, description="The volume that input images and masks are read from.")
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
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="Who may connect to the job's pods."
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
        from muralist_api.rules.problems import spec_problems  # the rules read these types: import at use

        problems = [f"{path}: {message}" for path, message in spec_problems(self)]
        if problems:
            raise ValueError("\n".join(problems))
        return self


class ObjectMeta(BaseModel):
    """The few metadata fields Muralist reads; the rest passes through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(description="Job name: a DNS label short enough for `<name>-<index>`.")
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None


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
        """Known only when every prompt is inline (promptsFrom and datasets are read in the pods)."""
        if self.spec.prompts_from is not None or self.spec.dataset is not None:
            return None
        return len(self.spec.prompts) * self.spec.generation.images_per_prompt

