"""Parallel strategies: one small object per `muralist_api.job.Strategy`, registered by name.

Every strategy answers the same four questions, in the order main.py asks them, and shares
no base class (the common helpers are module functions):
- `plan(spec, source, revision, gpu) -> Plan`: can this layout run here, on this model? The
  rules come from the catalog (the same functions admission uses) and the model's config files
  (no weights yet); the answer is a `Plan`, everything the later steps need.
- `check_model(pipe, plan)`: does the loaded model support the layout?
- `place(pipe, plan, world)`: device and attention backend, before the consistency canary's
  single-rank reference;
- `parallelize(pipe, plan, world)`: diffusers' enable_parallelism (cannot be undone).

Failures that retrying cannot fix raise PermanentFailure naming the spec field; every rank
reaches the same verdict from the same spec and model, so all ranks exit, none hangs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from muralist_api.contract import PermanentFailure
from muralist_api.job import ContextParallelSpec, DiffusionJobSpec, Strategy, TensorParallelSpec
from muralist_api.rules import catalog
from muralist_api.rules.catalog import CP_FIELD, TP_FIELD, Problem

from ..world.distributed import DistributedWorld
from .preflight import check_context_parallel

log = logging.getLogger("muralist")


@dataclass(frozen=True)
class Plan:
    """A strategy's decisions before loading, handed to every later step."""

    strategy: str
    group_size: int = 1  # ranks that render one image together
    load_kwargs: dict[str, Any] = field(default_factory=dict)  # extra from_pretrained arguments
    ring: int = 1
    ulysses: int = 1
    attention_backend: str | None = None
    uneven: str = ""  # diffusers' uneven-split mode (ContextParallelConfig.<mode>=True), or ""
    tp_degree: int = 1
    # The estimated peak per device of this layout (plan/confirm.py), for the job file; empty when unknown.
    memory_estimate: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """The group layout in words, for messages."""
        if self.strategy == Strategy.CONTEXT_PARALLEL:
            return f"ContextParallel ring {self.ring} x ulysses {self.ulysses}, {self.attention_backend}"
        if self.strategy == Strategy.TENSOR_PARALLEL:
            return f"TensorParallel degree {self.tp_degree}"
        return self.strategy


class ParallelStrategy(Protocol):
    name: ClassVar[str]

    def plan(self, spec: DiffusionJobSpec, source: str, revision: str | None, gpu: bool) -> Plan: ...

    def check_model(self, pipe: Any, plan: Plan) -> None: ...

    def place(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any: ...

    def parallelize(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any: ...


def raise_first(problems: list[Problem]) -> None:
    if problems:
        raise PermanentFailure(*problems[0])


def _transformer(pipe: Any) -> Any:
    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        raise PermanentFailure(
            "spec.parallelism.strategy",
            f"{type(pipe).__name__} has no transformer (UNet pipelines support neither context nor tensor "
            "parallelism); use strategy DataParallel or DeviceMap",
        )
    return transformer


def _check_transformer(pipe: Any, strategy: str, plan_attr: str, degree: int, field: str) -> None:
    transformer = _transformer(pipe)
    cls = type(transformer).__name__
    raise_first(catalog.transformer_plan_problems(strategy, cls, getattr(transformer, plan_attr, None) is not None))
    heads = getattr(transformer.config, "num_attention_heads", None)
    raise_first(catalog.heads_problems(heads, degree, field, cls))


@contextlib.contextmanager
def cpu_device_shim(gpu: bool) -> Iterator[None]:
    """Let diffusers' parallel setup run on a machine without GPUs (CPU + gloo).

    diffusers (0.42, ModelMixin._resolve_parallel_config) computes its device as
    `torch.device(accelerator_type, rank % torch.accelerator.device_count())`. Without a GPU
    the count is 0 (ZeroDivisionError), and a CUDA build still reports "cuda" as the
    accelerator type. While this context is active, and only when no GPU is present, the
    accelerator is the CPU with one device, so the device resolves to the CPU. We always pass
    our own mesh, so the device type is not used to build one. No effect with GPUs.
    """
    if gpu:
        yield
        return
    import torch

    saved_count, saved_get = torch.accelerator.device_count, torch._C._get_accelerator
    torch.accelerator.device_count = lambda: 1
    torch._C._get_accelerator = lambda: torch.device("cpu")
    try:
        yield
    finally:
        torch.accelerator.device_count = saved_count
        torch._C._get_accelerator = saved_get


class DataParallel:
    """Every rank renders its own images; nothing is exchanged while denoising."""

    name: ClassVar[str] = Strategy.DATA_PARALLEL.value

    def plan(self, spec: DiffusionJobSpec, source: str, revision: str | None, gpu: bool) -> Plan:
        return Plan(self.name)

    def check_model(self, pipe: Any, plan: Plan) -> None:
        return None

    def place(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any:
        return pipe.to(world.device)

    def parallelize(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any:
        return pipe


class DeviceMap:
    """One process per pod, the pipeline's components spread over the pod's GPUs."""

    name: ClassVar[str] = Strategy.DEVICE_MAP.value

    def plan(self, spec: DiffusionJobSpec, source: str, revision: str | None, gpu: bool) -> Plan:
        if not gpu:
            # diffusers drops CPU entries from the map: on CPU it would be empty anyway.
            return Plan(self.name)
        dm = spec.parallelism.device_map
        kwargs: dict[str, Any] = {"device_map": dm.policy if dm else "balanced"}
        if dm and dm.max_memory:
            kwargs["max_memory"] = {(int(k) if k.isdigit() else k): v for k, v in dm.max_memory.items()}
        return Plan(self.name, load_kwargs=kwargs)

    def check_model(self, pipe: Any, plan: Plan) -> None:
        return None

    def place(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any:
        # A mapped pipeline refuses `.to()`; an unmapped one (CPU) already sits on the CPU.
        return pipe

    def parallelize(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any:
        return pipe


class ContextParallel:
    """Groups of ring x ulysses consecutive ranks split each image's token sequence."""

    name: ClassVar[str] = Strategy.CONTEXT_PARALLEL.value

    def plan(self, spec: DiffusionJobSpec, source: str, revision: str | None, gpu: bool) -> Plan:
        par, gen = spec.parallelism, spec.generation
        cp = par.context_parallel or ContextParallelSpec()
        raise_first(catalog.context_parallel_problems(cp.ring_degree, cp.ulysses_degree, cp.attention_backend,
                                                      par.resolved_processes_per_node, gpu, par.nodes))
        verdict = check_context_parallel(source, revision, gen, spec.model.pipeline, cp.ring_degree,
                                         cp.ulysses_degree, allow_uneven=gpu)
        raise_first(verdict.problems)
        if verdict.uneven:
            log.warning("sequence lengths do not divide ring x ulysses %d: using diffusers' %s (uneven split, "
                        "slightly more communication)", cp.degree, verdict.uneven)
        return Plan(self.name, group_size=cp.degree, ring=cp.ring_degree, ulysses=cp.ulysses_degree,
                    attention_backend=cp.attention_backend, uneven=verdict.uneven)

    def check_model(self, pipe: Any, plan: Plan) -> None:
        _check_transformer(pipe, self.name, "_cp_plan", plan.ulysses, f"{CP_FIELD}.ulyssesDegree")

    def place(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any:
        pipe = pipe.to(world.device)
        pipe.transformer.set_attention_backend(plan.attention_backend)
        return pipe

    def parallelize(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any:
        from diffusers import ContextParallelConfig

        # A (dp, ring, ulysses) mesh, so several CP groups coexist in one world; diffusers gets
        # the group's (ring, ulysses) sub-mesh instead of building one over the world.
        mesh = world.mesh((world.layout.pg_groups, plan.ring, plan.ulysses), ("dp", "ring", "ulysses"))
        uneven = {plan.uneven: True} if plan.uneven else {}
        config = ContextParallelConfig(ring_degree=plan.ring, ulysses_degree=plan.ulysses,
                                       mesh=mesh["ring", "ulysses"], **uneven)
        with cpu_device_shim(world.device.type == "cuda"):
            pipe.transformer.enable_parallelism(config=config)
        return pipe


class TensorParallel:
    """Groups of `degree` consecutive ranks each hold a slice of every layer."""

    name: ClassVar[str] = Strategy.TENSOR_PARALLEL.value

    def plan(self, spec: DiffusionJobSpec, source: str, revision: str | None, gpu: bool) -> Plan:
        par = spec.parallelism
        tp = par.tensor_parallel or TensorParallelSpec()
        raise_first(catalog.tensor_parallel_problems(tp.degree, par.resolved_processes_per_node, gpu))
        # Heads are checked on the loaded model; tensor parallelism splits no sequence.
        return Plan(self.name, group_size=tp.degree, tp_degree=tp.degree)

    def check_model(self, pipe: Any, plan: Plan) -> None:
        _check_transformer(pipe, self.name, "_tp_plan", plan.tp_degree, f"{TP_FIELD}.degree")

    def place(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any:
        return pipe.to(world.device)

    def parallelize(self, pipe: Any, plan: Plan, world: DistributedWorld) -> Any:
        from diffusers import TensorParallelConfig

        mesh = world.mesh((world.layout.pg_groups, plan.tp_degree), ("dp", "tp"))
        with cpu_device_shim(world.device.type == "cuda"):
            pipe.transformer.enable_parallelism(config=TensorParallelConfig(tp_degree=plan.tp_degree,
                                                                            mesh=mesh["tp"]))
        return pipe


REGISTRY: dict[str, type[ParallelStrategy]] = {
    cls.name: cls for cls in (DataParallel, DeviceMap, ContextParallel, TensorParallel)
}


def get_strategy(name: str) -> ParallelStrategy:
    if name == Strategy.AUTO:
        raise PermanentFailure("spec.parallelism.strategy", "Auto is planned before the pods start (by the operator, "
                               "or by muralist run), and this spec was not: run it through either, or set the "
                               "strategy `muralist plan` prints")
    try:
        return REGISTRY[name]()
    except KeyError:
        raise PermanentFailure("spec.parallelism.strategy",
                               f"unknown strategy {name!r}; one of {sorted(REGISTRY)}") from None
