"""The DiffusionJob API types (`muralist.dev/v1alpha1`): the single source of truth.

Pure pydantic, no torch: the operator imports this module, and so does every pod. The CRD's
schema is generated from these models (`muralist crd`), so each field carries a description
that `kubectl explain` shows. Rules that need several fields live in `rules/problems.py` (with
the facts they use in the catalog: `rules/catalog.py`, `workloads.py`, `sequence.py`); the CRD's
CEL rules that mirror them are declared here, on the field or model they guard, each naming the
Python rule it mirrors (muralist_api/cel.py), and operator/muralist_operator/crd.py writes them
into the CRD.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from muralist_api.base import ApiModel, KubeObject, relative_path
from muralist_api.cel import CelRule, cel_list, python_rule
from muralist_api.data import Dataset, Inputs, PromptsFrom, PromptSpec
from muralist_api.options import Adapter, SchedulerSpec
from muralist_api.pods import KUEUE_TOPOLOGY_ANNOTATIONS, PodTemplate, RunPolicy
from muralist_api.rules import catalog, problems
from muralist_api.rules.catalog import ATTENTION_BACKENDS, DNS_LABEL_MAX
from muralist_api.status import DiffusionJobStatus
from muralist_api.step_cache import CacheSpec
from muralist_api.storage import StoredAt, location_rules

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
            "built-in tiny pipeline without download, for quickstarts and tests: random weights "
            "('muralist/tiny-flux') or trained to draw coloured shapes ('muralist/tiny-shapes-flux')."
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
    seed: int = Field(0, ge=0, description="Base seed; see the determinism rule in the docs (concepts/items.md).")
    batch_size: int = Field(1, ge=1, le=256, description="Images per pipeline call in one data-parallel group.")
    extra_args: KubeObject = Field(
        default_factory=dict,
        description="More keyword arguments for the pipeline call (e.g. max_sequence_length). Not what the spec "
        "or an item sets (prompt, negative_prompt, generator, latents, num_inference_steps, guidance_scale, "
        "height, width, num_frames, num_images_per_prompt, image, mask_image, strength, output_type): those are "
        "refused, naming the field to use.",
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


_CP_BACKENDS = [b.name for b in ATTENTION_BACKENDS.values() if b.context_parallel]
_RING_BACKENDS = [b.name for b in ATTENTION_BACKENDS.values() if b.context_parallel and b.lse]
_CPU_CP_BACKENDS = [b.name for b in ATTENTION_BACKENDS.values() if b.context_parallel and b.cpu]


class ContextParallelSpec(ApiModel):
    cel_rules = (
        CelRule(
            f"self.attentionBackend in {cel_list(_CP_BACKENDS)}",
            "spec.parallelism.contextParallel.attentionBackend: not a diffusers backend that supports "
            f"context parallelism; use one of {', '.join(_CP_BACKENDS)}",
            mirrors=catalog.backend_problems,
        ),
        CelRule(
            f"self.ringDegree == 1 || self.attentionBackend in {cel_list(_RING_BACKENDS)}",
            "spec.parallelism.contextParallel.attentionBackend: ring attention (ringDegree > 1) "
            f"needs a backend that returns LSE; use one of {', '.join(_RING_BACKENDS)} on GPUs, "
            "or set ringDegree: 1",
            mirrors=catalog.backend_problems,
        ),
    )

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


# Processes per pod as the models resolve it (Parallelism.resolved_processes_per_node), in CEL.
_PPN = (
    "(has(self.processesPerNode) ? self.processesPerNode : "
    "((self.strategy == 'DeviceMap' || self.gpusPerNode == 0) ? 1 : self.gpusPerNode))"
)
_CP_DEGREE = "(self.contextParallel.ringDegree * self.contextParallel.ulyssesDegree)"
# What a resize keeps: every field of spec.parallelism but nodes (always set: they have defaults; or optional).
_FIXED_LAYOUT = ("strategy", "gpusPerNode", "launcher", "collectiveTimeoutSeconds", "verify")
_OPTIONAL_LAYOUT = ("processesPerNode", "contextParallel", "tensorParallel", "deviceMap")


class Parallelism(ApiModel):
    cel_rules = (
        CelRule(
            "!(has(self.contextParallel) && has(self.tensorParallel))",
            "spec.parallelism: contextParallel and tensorParallel cannot both be set (diffusers' "
            "ParallelConfig refuses it); keep the one that matches strategy",
            mirrors=problems._strategy_section_problems,
        ),
        CelRule(
            "!has(self.contextParallel) || self.strategy == 'ContextParallel'",
            "spec.parallelism.contextParallel is only used by strategy ContextParallel; remove "
            "it or set strategy: ContextParallel",
            mirrors=problems._strategy_section_problems,
        ),
        CelRule(
            "!has(self.tensorParallel) || self.strategy == 'TensorParallel'",
            "spec.parallelism.tensorParallel is only used by strategy TensorParallel; remove it "
            "or set strategy: TensorParallel",
            mirrors=problems._strategy_section_problems,
        ),
        CelRule(
            "!has(self.deviceMap) || self.strategy == 'DeviceMap'",
            "spec.parallelism.deviceMap is only used by strategy DeviceMap; remove it or set strategy: DeviceMap",
            mirrors=problems._strategy_section_problems,
        ),
        CelRule(
            "self.strategy != 'DeviceMap' || !has(self.processesPerNode) || self.processesPerNode == 1",
            "spec.parallelism.processesPerNode: DeviceMap runs one process per pod over all its "
            "GPUs; set processesPerNode: 1 (or leave it out) and use nodes for replicas",
            mirrors=problems._process_problems,
        ),
        CelRule(
            "self.strategy == 'DeviceMap' || self.gpusPerNode == 0 || !has(self.processesPerNode) "
            "|| self.processesPerNode == self.gpusPerNode",
            "spec.parallelism.processesPerNode: with GPUs it is one process per GPU; set it to "
            "gpusPerNode or leave it out",
            mirrors=problems._process_problems,
        ),
        CelRule(
            f"self.strategy != 'ContextParallel' || (has(self.contextParallel) && {_CP_DEGREE} >= 2)",
            "spec.parallelism.contextParallel: ringDegree x ulyssesDegree must be 2 or more "
            "(1 is plain data parallelism); set ulyssesDegree or ringDegree",
            mirrors=catalog.context_parallel_problems,
        ),
        CelRule(
            f"self.strategy != 'ContextParallel' || !has(self.contextParallel) || {_PPN} % {_CP_DEGREE} == 0 "
            f"|| ({_CP_DEGREE} % {_PPN} == 0 && self.nodes % ({_CP_DEGREE} / {_PPN}) == 0)",
            "spec.parallelism.contextParallel: ringDegree x ulyssesDegree must divide processesPerNode (a group "
            "inside one pod) or be a multiple of it that divides the pods (a group over whole pods)",
            mirrors=catalog.context_parallel_problems,
        ),
        CelRule(
            "self.strategy != 'TensorParallel' || "
            f"{_PPN} % (has(self.tensorParallel) ? self.tensorParallel.degree : 2) == 0",
            "spec.parallelism.tensorParallel.degree must divide processesPerNode (a group stays inside one pod)",
            mirrors=catalog.tensor_parallel_problems,
        ),
        CelRule(
            "self.strategy != 'TensorParallel' || self.gpusPerNode > 0",
            "spec.parallelism.gpusPerNode: TensorParallel needs GPUs (diffusers refuses it on "
            "CPU); set gpusPerNode or use DataParallel / ContextParallel",
            mirrors=catalog.tensor_parallel_problems,
        ),
        CelRule(
            "self.strategy != 'ContextParallel' || self.gpusPerNode > 0 || !has(self.contextParallel) || "
            f"self.contextParallel.attentionBackend in {cel_list(_CPU_CP_BACKENDS)}",
            "spec.parallelism.contextParallel.attentionBackend: needs GPUs and this job has none; on CPU "
            f"use one of {', '.join(_CPU_CP_BACKENDS)}",
            mirrors=catalog.backend_problems,
        ),
        CelRule(
            " && ".join([*(f"self.{f} == oldSelf.{f}" for f in _FIXED_LAYOUT),
                         *(f"has(self.{f}) == has(oldSelf.{f}) && (!has(self.{f}) || self.{f} == oldSelf.{f})"
                           for f in _OPTIONAL_LAYOUT)]),
            "spec.parallelism: only nodes can change after creation (a resize: kubectl scale dj/NAME "
            "--replicas=N); create a new DiffusionJob for another layout",
            cel_only="a transition rule: Python validates a manifest, not a change to one",
        ),
        CelRule(
            f"self.nodes == oldSelf.nodes || self.strategy != 'ContextParallel' || !has(self.contextParallel) "
            f"|| {_PPN} % {_CP_DEGREE} == 0",
            "spec.parallelism.nodes can change while the job runs only when each context-parallel group fits in "
            "one pod (ringDegree x ulyssesDegree divides processesPerNode): a group spanning pods cannot lose or "
            "gain one; keep nodes, or create a new DiffusionJob",
            cel_only="a transition rule: Python validates a manifest, not a change to one",
        ),
    )

    strategy: Strategy = Field(
        Strategy.DATA_PARALLEL,
        description="DataParallel | DeviceMap | ContextParallel | TensorParallel.",
    )
    nodes: int = Field(1, ge=1, le=1024, description="Pods (torchrun agents), one per node. May change while "
                       "the job runs (kubectl scale dj/NAME --replicas=N) when its groups fit in a pod: new pods "
                       "start claiming work at once, removed ones (the highest indexes) hand theirs back.")
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

    @property
    def resizable(self) -> bool:
        """Whether nodes may change while the job runs: every group fits in one pod (each pod is a
        world of its own, so pods come and go without a rendezvous)."""
        return self.group_size <= self.resolved_processes_per_node


@python_rule()
def output_path(value: str) -> str:
    """spec.output.path: a directory inside the volume (relative, no '..') that is not empty."""
    if not value.strip("/") and not value.startswith("/"):
        raise ValueError("must not be empty; leave it out to use metadata.name")
    return relative_path(value)


class Output(StoredAt):
    section = "spec.output"
    cel_rules = location_rules(section, volume_required=False)

    volume: KubeObject | None = Field(
        None,
        description="A Kubernetes VolumeSource for the results (e.g. a PVC); default an emptyDir (or set uri: "
        "the results are then written as whole objects under <uri>/<path>).",
    )
    path: Annotated[
        str | None,
        CelRule("!self.startsWith('/')", "spec.output.path must be relative to the volume", mirrors=output_path),
        CelRule(
            "!self.matches('(^|/)[.][.](/|$)')",
            "spec.output.path must not contain '..': it must stay inside the volume",
            mirrors=output_path,
        ),
        CelRule("self.matches('[^/]')", "spec.output.path must not be empty", mirrors=output_path),
    ] = Field(
        None,
        max_length=1024,
        description="Directory inside the volume (or under the uri), relative, without '..'; default "
        "metadata.name.",
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
    shared: bool = Field(
        False,
        description="Render into a folder that another DiffusionJob (another name or namespace) wrote: its items "
        "made for the same request are kept, the others rendered again, and the folder is this job's from then "
        "on. Without it such a folder is refused (exit 78). Jobs take turns: two must not run into one folder at "
        "once. The same job deleted and applied again needs no sharing: it resumes.",
    )

    @field_validator("path")
    @classmethod
    def _relative_inside_volume(cls, value: str | None) -> str | None:
        return value if value is None else output_path(value)


class NetworkPolicySpec(ApiModel):
    enabled: bool | None = Field(
        None,
        description="Give the job a NetworkPolicy that lets only its own pods connect to its pods: to the "
        "work-claim store on the first pod, the rendezvous of worlds that span pods and their process groups "
        "(outgoing traffic stays open). Default: the operator's setting (on unless the Helm chart's "
        "networkPolicies.jobs is false). Enforced only where the cluster's network plugin enforces "
        "NetworkPolicies (Calico, Cilium, ...).",
    )


def immutable(field: str) -> CelRule:
    """spec.<field> is fixed at creation (a transition rule: Python sees a manifest, not a change)."""
    return CelRule(
        "self == oldSelf",
        f"spec.{field} cannot change after creation; create a new DiffusionJob (runPolicy fields can change)",
        cel_only="a transition rule: Python validates a manifest, not a change to one",
    )


class DiffusionJobSpec(ApiModel):
    cel_rules = (
        CelRule(
            "!(self.parallelism.strategy in ['ContextParallel', 'TensorParallel']) || self.generation.batchSize == 1",
            "spec.generation.batchSize: a ContextParallel or TensorParallel group renders one "
            "image at a time; set batchSize: 1",
            mirrors=problems._layout_problems,
        ),
        *(CelRule(
            f"!has(self.{a}) || !has(self.{a}.credentialsSecret) || !has(self.{b}) || "
            f"!has(self.{b}.credentialsSecret) || self.{a}.credentialsSecret == self.{b}.credentialsSecret",
            f"spec.{b}.credentialsSecret: the job's pods have one set of storage credentials (a Secret's keys "
            f"become their environment); use the same Secret as spec.{a}.credentialsSecret",
            mirrors=problems._storage_problems,
        ) for a, b in (("dataset", "inputs"), ("dataset", "output"), ("inputs", "output"))),
        CelRule(
            "!has(self.runPolicy) || !has(self.runPolicy.workloadSlices) || !self.runPolicy.workloadSlices || "
            "has(self.runPolicy.queueName)",
            "spec.runPolicy.workloadSlices: resizes through Kueue, which admits only a queued job; set "
            "runPolicy.queueName or remove workloadSlices",
            mirrors=problems._queue_problems,
        ),
        CelRule(
            "!has(self.runPolicy) || !has(self.runPolicy.workloadSlices) || !self.runPolicy.workloadSlices || "
            "!has(self.podTemplate) || !has(self.podTemplate.annotations) || "
            f"!{cel_list(list(KUEUE_TOPOLOGY_ANNOTATIONS))}.exists(k, k in self.podTemplate.annotations)",
            "spec.runPolicy.workloadSlices: Kueue does not resize a job whose pods request a topology "
            "(podTemplate.annotations); remove the topology annotation or workloadSlices",
            mirrors=problems._queue_problems,
        ),
        CelRule(
            # The volume's contents are free-form (CEL cannot see an emptyDir in it): the Python rule also
            # refuses an explicit emptyDir.
            "self.parallelism.nodes <= 1 || has(self.output.uri) || has(self.output.volume)",
            "spec.output: with several pods, set spec.output.volume to a volume every pod mounts (a "
            "ReadWriteMany PersistentVolumeClaim) or spec.output.uri to object storage: the default emptyDir is "
            "each pod's own, so the first pod could not merge the others' images",
            mirrors=problems._shared_output_problems,
        ),
        CelRule(
            "has(self.promptsFrom) == has(oldSelf.promptsFrom)",
            "spec.promptsFrom cannot be added or removed after creation; create a new DiffusionJob",
            cel_only="a transition rule: Python validates a manifest, not a change to one",
        ),
    )

    model: Annotated[ModelSpec, immutable("model")] = Field(description="The diffusion model to load.")
    prompts: list[str | PromptSpec] = Field(
        default_factory=list,
        max_length=50_000,
        description="Prompts: strings or {text, negativePrompt, seed}.",
    )
    prompts_from: Annotated[PromptsFrom | None, immutable("promptsFrom")] = Field(
        None, description="More prompts from a ConfigMap (one per line).")
    dataset: Dataset | None = Field(
        None,
        description="Rows from files on a volume or in object storage (JSON Lines, CSV, Parquet, text, a saved "
        "datasets dataset), for "
        "jobs of 10^5-10^7 items; instead of prompts and promptsFrom.",
    )
    inputs: Inputs | None = Field(
        None, description="Where input images and masks are read from: a volume, or object storage (uri).")
    generation: Annotated[Generation, immutable("generation")] = Field(
        default_factory=Generation, description="Sampling parameters.")
    # Its own transition rules (Parallelism): fixed but for nodes, the size a resize changes.
    parallelism: Parallelism = Field(
        default_factory=Parallelism, description="How the work is split over pods, processes and GPUs."
    )
    output: Annotated[Output, immutable("output")] = Field(
        default_factory=Output, description="Where images are written.")
    image: Annotated[str, immutable("image")] = Field(
        "", description="Runtime container image; default from the operator settings.")
    resources: Annotated[KubeObject, immutable("resources")] = Field(
        default_factory=dict,
        description="Container resources; default requests/limits nvidia.com/gpu = gpusPerNode.",
    )
    pod_template: Annotated[PodTemplate, immutable("podTemplate")] = Field(
        default_factory=PodTemplate, description="Pod scheduling and metadata.")
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy, description="Restarts, deadlines, suspension and queueing."
    )
    # The operator creates the job's NetworkPolicy with the job, once.
    network_policy: Annotated[NetworkPolicySpec, immutable("networkPolicy")] = Field(
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
    def _cross_field_rules(self, info: ValidationInfo) -> DiffusionJobSpec:
        if isinstance(info.context, dict) and info.context.get(problems.CROSS_FIELD_RULES) is False:
            return self
        found = [f"{path}: {message}" for path, message in problems.spec_problems(self)]
        if found:
            raise ValueError("\n".join(found))
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
    # The CRD's root: `self` is the whole object.
    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            f"size(self.metadata.name) + 1 + size(string(self.spec.parallelism.nodes - 1)) <= {DNS_LABEL_MAX}",
            f"metadata.name is too long: pod hostname <name>-<index> must fit in {DNS_LABEL_MAX} "
            "characters; shorten the name",
            mirrors=problems.name_problem,
        ),
    )

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

