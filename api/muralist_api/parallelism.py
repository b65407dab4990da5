"""spec.parallelism: how a job's work is split over pods, processes and GPUs, and the rules of its layout.

The strategies (`Strategy`; Auto is resolved to one of the others by muralist_api/planner/) and each
one's own section (contextParallel, tensorParallel, deviceMap); how many ranks a job has and how many of
them render one image together (`Parallelism.group_size`). The rules that read spec.parallelism alone are
here, beside the CEL rules that mirror them (`strategy_section_problems`, `auto_problems`,
`process_problems`); those that need the model's layout are the catalog's (rules/catalog.py), and those
across the spec's sections job.py's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field
from pydantic.alias_generators import to_camel

from muralist_api.base import ApiModel
from muralist_api.cel import CelRule, cel_list, python_rule
from muralist_api.rules import catalog
from muralist_api.rules.catalog import ATTENTION_BACKENDS, Problem


class Strategy(StrEnum):
    DATA_PARALLEL = "DataParallel"
    DEVICE_MAP = "DeviceMap"
    CONTEXT_PARALLEL = "ContextParallel"
    TENSOR_PARALLEL = "TensorParallel"
    # Resolved to one of the above before anything runs: by the operator from the nodes it sees, by
    # `muralist run` from this machine (muralist_api/planner/).
    AUTO = "Auto"


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


@python_rule()
def strategy_section_problems(par: Parallelism) -> list[Problem]:
    """A strategy's own section (contextParallel, ...) only goes with that strategy."""
    out: list[Problem] = []
    if par.context_parallel is not None and par.tensor_parallel is not None:
        out.append(("spec.parallelism", "contextParallel and tensorParallel cannot both be set (diffusers' "
                    "ParallelConfig refuses it); keep the one that matches strategy"))
    for field, strategy in (("context_parallel", "ContextParallel"), ("tensor_parallel", "TensorParallel"),
                            ("device_map", "DeviceMap")):
        if getattr(par, field) is not None and par.strategy != strategy:
            out.append((f"spec.parallelism.{to_camel(field)}",
                        f"is only used by strategy {strategy}, but strategy is {par.strategy}; remove it or set "
                        f"strategy: {strategy}"))
    return out


@python_rule()
def auto_problems(par: Parallelism) -> list[Problem]:
    """objective goes with strategy Auto; Auto with GPUs chooses the processes itself."""
    out: list[Problem] = []
    if par.objective is not None and par.strategy != Strategy.AUTO:
        out.append(("spec.parallelism.objective", f"is only used by strategy Auto (which plans for it), but strategy "
                    f"is {par.strategy}; remove it or set strategy: Auto"))
    if par.strategy == Strategy.AUTO and par.gpus_per_node > 0 and par.processes_per_node is not None:
        out.append(("spec.parallelism.processesPerNode", "is chosen by strategy Auto when the pods have GPUs (one per "
                    "GPU, or one per pod for DeviceMap); remove it"))
    return out


@python_rule()
def process_problems(par: Parallelism) -> list[Problem]:
    if par.strategy == "DeviceMap":
        if par.processes_per_node in (None, 1):
            return []
        return [("spec.parallelism.processesPerNode",
                 f"is {par.processes_per_node}, but DeviceMap runs one process per pod over all its GPUs: set "
                 "processesPerNode: 1 (or leave it out) and use nodes for replicas")]
    if par.gpus_per_node > 0 and par.processes_per_node not in (None, par.gpus_per_node):
        return [("spec.parallelism.processesPerNode",
                 f"is {par.processes_per_node} but gpusPerNode is {par.gpus_per_node}; with GPUs it is one "
                 f"process per GPU: set processesPerNode: {par.gpus_per_node} or leave it out")]
    return []


# Processes per pod as the models resolve it (Parallelism.resolved_processes_per_node), in CEL.
_PPN = (
    "(has(self.processesPerNode) ? self.processesPerNode : "
    "((self.strategy == 'DeviceMap' || self.gpusPerNode == 0) ? 1 : self.gpusPerNode))"
)
_CP_DEGREE = "(self.contextParallel.ringDegree * self.contextParallel.ulyssesDegree)"
# What a resize keeps: every field of spec.parallelism but nodes (always set: they have defaults; or optional).
_FIXED_LAYOUT = ("strategy", "gpusPerNode", "launcher", "collectiveTimeoutSeconds", "verify")
_OPTIONAL_LAYOUT = ("processesPerNode", "contextParallel", "tensorParallel", "deviceMap", "objective")


class Parallelism(ApiModel):
    cel_rules = (
        CelRule(
            "!(has(self.contextParallel) && has(self.tensorParallel))",
            "spec.parallelism: contextParallel and tensorParallel cannot both be set (diffusers' "
            "ParallelConfig refuses it); keep the one that matches strategy",
            mirrors=strategy_section_problems,
        ),
        CelRule(
            "!has(self.contextParallel) || self.strategy == 'ContextParallel'",
            "spec.parallelism.contextParallel is only used by strategy ContextParallel; remove "
            "it or set strategy: ContextParallel",
            mirrors=strategy_section_problems,
        ),
        CelRule(
            "!has(self.tensorParallel) || self.strategy == 'TensorParallel'",
            "spec.parallelism.tensorParallel is only used by strategy TensorParallel; remove it "
            "or set strategy: TensorParallel",
            mirrors=strategy_section_problems,
        ),
        CelRule(
            "!has(self.deviceMap) || self.strategy == 'DeviceMap'",
            "spec.parallelism.deviceMap is only used by strategy DeviceMap; remove it or set strategy: DeviceMap",
            mirrors=strategy_section_problems,
        ),
        CelRule(
            "self.strategy != 'DeviceMap' || !has(self.processesPerNode) || self.processesPerNode == 1",
            "spec.parallelism.processesPerNode: DeviceMap runs one process per pod over all its "
            "GPUs; set processesPerNode: 1 (or leave it out) and use nodes for replicas",
            mirrors=process_problems,
        ),
        CelRule(
            "self.strategy == 'DeviceMap' || self.gpusPerNode == 0 || !has(self.processesPerNode) "
            "|| self.processesPerNode == self.gpusPerNode",
            "spec.parallelism.processesPerNode: with GPUs it is one process per GPU; set it to "
            "gpusPerNode or leave it out",
            mirrors=process_problems,
        ),
        CelRule(
            "!has(self.objective) || self.strategy == 'Auto'",
            "spec.parallelism.objective is only used by strategy Auto; remove it or set strategy: Auto",
            mirrors=auto_problems,
        ),
        CelRule(
            "self.strategy != 'Auto' || self.gpusPerNode == 0 || !has(self.processesPerNode)",
            "spec.parallelism.processesPerNode is chosen by strategy Auto when the pods have GPUs; remove it",
            mirrors=auto_problems,
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
        description="DataParallel | DeviceMap | ContextParallel | TensorParallel | Auto. Auto chooses one of the "
        "others, its processes and degrees from the model's sizes and the GPUs the nodes have (status.parallelPlan "
        "says which and why); `muralist plan` prints the same choice.",
    )
    objective: Literal["throughput", "latency"] | None = Field(
        None, description="What strategy Auto plans for: throughput (the default: batch jobs, each device renders "
        "its own items) or latency (one item split over the pod's devices where the model allows).")
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
