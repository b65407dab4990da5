"""The DiffusionJob (`muralist.dev/v1alpha1`), its spec as a whole, and the rules across the spec's sections.

Pure pydantic, no torch: the operator imports this module, and so does every pod. The CRD's
schema is generated from these models (`muralist crd`), so each field carries a description
that `kubectl explain` shows. Each section of the spec has its module: `model` (spec.model),
`generation`, `parallelism`, `output`, `data` (prompts, promptsFrom, dataset, inputs), `pods`
(podTemplate, runPolicy, networkPolicy), `storage` (a volume or a uri); the names most callers use
are re-exported here (`from muralist_api.job import Parallelism` works).

A rule about one section lives beside it; the rules across sections live here (`spec_problems`
runs every rule of a spec, and DiffusionJobSpec's validator runs it, unless the validation
context says `CROSS_FIELD_RULES: False`), with the facts they use in the rules catalog
(`rules/catalog.py`, `workloads.py`, `sequence.py`). The CRD's CEL rules that mirror them are
declared on the field or model they guard, each naming the Python rule it mirrors
(muralist_api/cel.py), and operator/muralist_operator/crd.py writes them into the CRD. Parsing a
manifest, every problem named by its field, is rules/problems.py's.
"""

from __future__ import annotations

import itertools
import re
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from muralist_api.base import ApiModel, KubeObject, shown
from muralist_api.cel import CelRule, cel_list, python_rule
from muralist_api.data import Dataset, Inputs, PromptsFrom, PromptSpec
from muralist_api.generation import Generation
from muralist_api.model import ModelLoading, ModelSpec, SecretKeyRef
from muralist_api.output import Output, output_path
from muralist_api.parallelism import (
    ContextParallelSpec,
    DeviceMapSpec,
    Parallelism,
    Strategy,
    TensorParallelSpec,
    auto_problems,
    process_problems,
    strategy_section_problems,
)
from muralist_api.pods import KUEUE_TOPOLOGY_ANNOTATIONS, NetworkPolicySpec, PodTemplate, RunPolicy
from muralist_api.rules import catalog, workloads
from muralist_api.rules.catalog import DNS_LABEL_MAX, Problem
from muralist_api.status import DiffusionJobStatus
from muralist_api.step_cache import cache_problems
from muralist_api.storage import StoredAt, location_problems

__all__ = [
    "API_VERSION",
    "CROSS_FIELD_RULES",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "ContextParallelSpec",
    "DeviceMapSpec",
    "DiffusionJob",
    "DiffusionJobSpec",
    "Generation",
    "ModelLoading",
    "ModelSpec",
    "NetworkPolicySpec",
    "ObjectMeta",
    "Output",
    "Parallelism",
    "SecretKeyRef",
    "Strategy",
    "TensorParallelSpec",
    "name_problem",
    "output_path",
    "spec_problems",
]

GROUP = "muralist.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DiffusionJob"
PLURAL = "diffusionjobs"
SINGULAR = "diffusionjob"
SHORT_NAMES = ["dj"]

DNS_1035_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# The validation context's key that turns spec_problems off (rules.problems.parse_job's cross_field_rules).
CROSS_FIELD_RULES = "crossFieldRules"


@python_rule()
def name_problem(name: str, nodes: int) -> str | None:
    if not re.match(DNS_1035_LABEL_PATTERN, name):
        return (
            f"metadata.name: {shown(name)} must be a DNS label (lowercase letters, digits, '-', "
            "starting with a letter) because it names the headless Service and pod hostnames"
        )
    longest = f"{name}-{nodes - 1}"
    if len(longest) > DNS_LABEL_MAX:
        keep = DNS_LABEL_MAX - len(f"-{nodes - 1}")
        return (
            f"metadata.name: {shown(name)} is {len(name)} characters; pod hostname {shown(longest)} would "
            f"exceed {DNS_LABEL_MAX}: use at most {keep} characters"
        )
    return None


# -- rules across the spec's sections ----------------------------------------------------------


def spec_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """Every cross-field rule of a spec: (field path, message with the fix); empty when valid."""
    return [*source_problems(spec),
            *(p for section in (spec.dataset, spec.inputs, spec.output) if section is not None
              for p in location_problems(section)),
            *credentials_problems(spec), *shared_output_problems(spec),
            *strategy_section_problems(spec.parallelism), *auto_problems(spec.parallelism),
            *process_problems(spec.parallelism),
            *layout_problems(spec), *workload_problems(spec), *queue_problems(spec), *checkpoint_problems(spec),
            *size_problems(spec)]


@python_rule(no_cel=(
    "not in the CRD yet (CEL could say it; adding it changes the CRD): the operator refuses such a job "
    "when it parses it"
))
def source_problems(spec: DiffusionJobSpec) -> list[Problem]:
    if spec.dataset is not None:
        if spec.prompts or spec.prompts_from is not None:
            return [("spec.dataset", "rows come from the data set alone; remove prompts and promptsFrom, or the "
                     "dataset")]
        if spec.dataset.end is not None and spec.dataset.end <= spec.dataset.start:
            return [("spec.dataset.end", f"is {spec.dataset.end}, not after start {spec.dataset.start}")]
        return []
    if not spec.prompts and spec.prompts_from is None:
        return [("spec.prompts", "no prompts; add at least one to prompts, set promptsFrom, or use spec.dataset")]
    return []


@python_rule()
def credentials_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """One credentials Secret for the whole job (each section's own rules: storage.location_problems)."""
    out: list[Problem] = []
    secrets = {s.section: s.credentials_secret for s in spec.object_storage() if s.credentials_secret is not None}
    for name, secret in list(secrets.items())[1:]:
        first, first_secret = next(iter(secrets.items()))
        if secret != first_secret:
            out.append((f"{name}.credentialsSecret",
                        f"is {shown(secret)}, but {first}.credentialsSecret is {shown(first_secret)}: the job's pods "
                        "have one set of storage credentials (a Secret's keys become their environment); use one "
                        "Secret"))
    return out


@python_rule()
def shared_output_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """Pods of one job must see each other's outputs: the first pod merges every chunk, whichever pod
    rendered it. An emptyDir (spec.output.volume unset, or set to one) is each pod's own."""
    out = spec.output
    nodes = spec.parallelism.nodes
    if nodes <= 1 or out.uri is not None or (out.volume is not None and "emptyDir" not in out.volume):
        return []
    what = "spec.output.volume is an emptyDir" if out.volume is not None else \
        "spec.output sets no volume (the default is an emptyDir)"
    return [("spec.output", f"{what}, which each of the {nodes} pods gets its own: the first pod could not merge "
             "the images the others render, and they would go with their pods; set spec.output.volume to a volume "
             "every pod mounts (a ReadWriteMany PersistentVolumeClaim: {persistentVolumeClaim: {claimName: "
             "results}}), or spec.output.uri to object storage, or nodes: 1")]


def _input_uses(spec: DiffusionJobSpec) -> tuple[set[str], str]:
    """Which inputs the job's items carry ("image", "mask"), and the field that says so."""
    if spec.dataset is not None:
        cols = spec.dataset.columns
        return {u for u, c in (("image", cols.image), ("mask", cols.mask)) if c}, "spec.dataset.columns"
    uses = set()
    for p in spec.prompt_objects:
        uses |= {u for u, v in (("image", p.image), ("mask", p.mask)) if v}
    return uses, "spec.prompts"


@python_rule(no_cel=(
    "needs the rules catalog's tables (model pipelines, inputs, schedulers, caches), which the CRD does "
    "not carry (its fuseAdapters rule alone could be CEL, not in the CRD yet); the operator refuses such "
    "a job when it parses it"
))
def workload_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """Inputs, videos, the scheduler, the cache, adapters and the call's extraArgs against what the catalog
    knows."""
    gen, par = spec.generation, spec.parallelism
    pipeline = spec.model.pipeline or catalog.KNOWN_MODEL_PIPELINES.get(spec.model.name)
    uses, field_name = _input_uses(spec)
    out: list[Problem] = []
    if uses and spec.inputs is None:
        out.append(("spec.inputs", f"{field_name} name input images; set spec.inputs.volume or spec.inputs.uri to "
                    "where they are"))
    out += workloads.input_problems(pipeline, uses, field_name)
    out += workloads.video_problems(pipeline, gen.num_frames, gen.height, gen.width, spec.output.format)
    if gen.scheduler is not None:
        out += workloads.scheduler_problems(gen.scheduler.name)
    if gen.cache is not None:
        out += cache_problems(gen.cache.type, gen.cache.options, par.strategy)
    out += workloads.extra_args_problems(gen.extra_args)
    if spec.run_policy.checkpoint is not None:
        out += workloads.checkpoint_pipeline_problems(pipeline)
    if spec.model.adapters and par.strategy == "TensorParallel" and not spec.model.fuse_adapters:
        out.append(("spec.model.fuseAdapters", "TensorParallel shards the base layers, and a LoRA must be merged "
                    "into them first; set fuseAdapters: true"))
    return out


@python_rule()
def layout_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """The CP / TP layout against the catalog (the runtime checks the same on the machine)."""
    par = spec.parallelism
    if par.strategy not in ("ContextParallel", "TensorParallel"):
        return []
    ppn, gpu = par.resolved_processes_per_node, par.gpus_per_node > 0
    if par.strategy == "ContextParallel":
        cp = par.context_parallel or ContextParallelSpec()
        out = catalog.context_parallel_problems(cp.ring_degree, cp.ulysses_degree, cp.attention_backend, ppn, gpu,
                                                par.nodes)
    else:
        tp = par.tensor_parallel or TensorParallelSpec()
        out = catalog.tensor_parallel_problems(tp.degree, ppn, gpu)
    if spec.generation.batch_size != 1:
        out.append(("spec.generation.batchSize",
                    f"is {spec.generation.batch_size}, but a {par.strategy} group renders one image at a time "
                    "(batched context parallelism is broken in several models); set batchSize: 1"))
    return out + catalog.plan_problems(par.strategy, catalog.known_layout(spec.model.name, spec.model.pipeline))


@python_rule()
def queue_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """runPolicy.workloadSlices: Kueue's elastic workload slices need a queue and no topology request."""
    policy = spec.run_policy
    if not policy.workload_slices:
        return []
    out: list[Problem] = []
    if policy.queue_name is None:
        out.append(("spec.runPolicy.workloadSlices", "resizes through Kueue, which admits only a queued job; set "
                    "runPolicy.queueName or remove workloadSlices"))
    for key in KUEUE_TOPOLOGY_ANNOTATIONS:
        if key in spec.pod_template.annotations:
            out.append(("spec.runPolicy.workloadSlices", f"Kueue does not resize a job whose pods request a topology "
                        f"(podTemplate.annotations[{key}]); remove that annotation or workloadSlices"))
    return out


@python_rule()
def checkpoint_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """runPolicy.checkpoint holds one item's denoising state, and nothing else that steps carry: it needs one item
    per call and no step cache (the pipeline's own rule is the catalog's: workload_problems)."""
    if spec.run_policy.checkpoint is None:
        return []
    out: list[Problem] = []
    gen = spec.generation
    if gen.cache is not None:
        out.append((workloads.CHECKPOINT_FIELD, f"the step cache (generation.cache: {gen.cache.type}) carries state "
                    "from step to step that a checkpoint does not hold, so a resumed item would not be the "
                    "uninterrupted one; remove generation.cache or runPolicy.checkpoint"))
    if gen.batch_size != 1:
        out.append((workloads.CHECKPOINT_FIELD, f"holds one item's denoising state, and generation.batchSize is "
                    f"{gen.batch_size} (a batch resumed by another call would not be the same batch); set batchSize: "
                    "1 or remove runPolicy.checkpoint"))
    return out


@python_rule(no_cel="measures the serialized spec, which CEL cannot; the operator refuses such a job when it parses it")
def size_problems(spec: DiffusionJobSpec) -> list[Problem]:
    size = len(spec.model_dump_json(by_alias=True, exclude_none=True).encode())
    return catalog.spec_size_problems(size, len(spec.prompts))


# -- the spec and the job ----------------------------------------------------------------------


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
            mirrors=layout_problems,
        ),
        *(CelRule(
            f"!has(self.{a}) || !has(self.{a}.credentialsSecret) || !has(self.{b}) || "
            f"!has(self.{b}.credentialsSecret) || self.{a}.credentialsSecret == self.{b}.credentialsSecret",
            f"spec.{b}.credentialsSecret: the job's pods have one set of storage credentials (a Secret's keys "
            f"become their environment); use the same Secret as spec.{a}.credentialsSecret",
            mirrors=credentials_problems,
        ) for a, b in itertools.combinations(("dataset", "inputs", "output", "model.compileCache"), 2)),
        CelRule(
            "!has(self.runPolicy) || !has(self.runPolicy.workloadSlices) || !self.runPolicy.workloadSlices || "
            "has(self.runPolicy.queueName)",
            "spec.runPolicy.workloadSlices: resizes through Kueue, which admits only a queued job; set "
            "runPolicy.queueName or remove workloadSlices",
            mirrors=queue_problems,
        ),
        CelRule(
            "!has(self.runPolicy) || !has(self.runPolicy.workloadSlices) || !self.runPolicy.workloadSlices || "
            "!has(self.podTemplate) || !has(self.podTemplate.annotations) || "
            f"!{cel_list(list(KUEUE_TOPOLOGY_ANNOTATIONS))}.exists(k, k in self.podTemplate.annotations)",
            "spec.runPolicy.workloadSlices: Kueue does not resize a job whose pods request a topology "
            "(podTemplate.annotations); remove the topology annotation or workloadSlices",
            mirrors=queue_problems,
        ),
        CelRule(
            # The volume's contents are free-form (CEL cannot see an emptyDir in it): the Python rule also
            # refuses an explicit emptyDir.
            "self.parallelism.nodes <= 1 || has(self.output.uri) || has(self.output.volume)",
            "spec.output: with several pods, set spec.output.volume to a volume every pod mounts (a "
            "ReadWriteMany PersistentVolumeClaim) or spec.output.uri to object storage: the default emptyDir is "
            "each pod's own, so the first pod could not merge the others' images",
            mirrors=shared_output_problems,
        ),
        CelRule(
            "!has(self.runPolicy) || !has(self.runPolicy.checkpoint) || !has(self.generation) || "
            "!has(self.generation.cache)",
            "spec.runPolicy.checkpoint: the step cache (generation.cache) carries state from step to step that a "
            "checkpoint does not hold; remove generation.cache or runPolicy.checkpoint",
            mirrors=checkpoint_problems,
        ),
        CelRule(
            "!has(self.runPolicy) || !has(self.runPolicy.checkpoint) || !has(self.generation) || "
            "!has(self.generation.batchSize) || self.generation.batchSize == 1",
            "spec.runPolicy.checkpoint: holds one item's denoising state; set generation.batchSize: 1 or remove "
            "runPolicy.checkpoint",
            mirrors=checkpoint_problems,
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

    def object_storage(self) -> list[StoredAt]:
        """The sections that name object storage (a uri): the job's pods get their one credentials Secret."""
        return [s for s in (self.dataset, self.inputs, self.output, self.model.compile_cache) if s and s.uri]

    @property
    def prompt_objects(self) -> list[PromptSpec]:
        return [PromptSpec(text=p) if isinstance(p, str) else p for p in self.prompts]

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> DiffusionJobSpec:
        if isinstance(info.context, dict) and info.context.get(CROSS_FIELD_RULES) is False:
            return self
        found = [f"{path}: {message}" for path, message in spec_problems(self)]
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
            mirrors=name_problem,
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
