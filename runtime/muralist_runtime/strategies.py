"""Parallel strategies: one small object per `spec.Strategy`, registered by name.

Every strategy answers the same questions, in the order main.py asks them:
- `validate(spec, gpu)`: can this layout run on this machine at all? (before loading)
- `preflight(spec, source, revision, gpu)`: does the layout fit the model's configs? (config.json
  files only, before loading the weights)
- `load_kwargs(spec, gpu)`: extra `from_pretrained` arguments (DeviceMap's device_map).
- `check_model(pipe, spec)`: does the loaded model support the layout? (before generating)
- `prepare(pipe, spec, world)`: move / parallelise the pipeline, in two halves so that the
  consistency canary can render its single-rank reference in between: `place` (device,
  attention backend) then `parallelize` (diffusers' enable_parallelism).
- `plan(tasks, layout)`: this rank's images (every rank of a group gets the same list).

Failures that retrying cannot fix raise spec.PermanentFailure naming the spec field; every
rank reaches the same verdict from the same spec and model, so all ranks exit, none hangs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, TypeVar

from .spec import (
    ContextParallelSpec,
    DiffusionJobSpec,
    ImageTask,
    PermanentFailure,
    Strategy,
    TensorParallelSpec,
)
from .world import Layout, World

T = TypeVar("T")

# Attention backends that run without a GPU (the others need CUDA kernels or other devices).
CPU_BACKENDS = frozenset({"native", "_native_math", "flex"})

# diffusers attention backends that cannot return the log-sum-exp ring attention merges with
# ("Native attention does not support return_lse=True" and the like, attention_dispatch.py).
NO_LSE_BACKENDS = frozenset(
    {"native", "_native_efficient", "_native_math", "_native_npu", "_native_xla",
     "sage_varlen", "xformers"}
)


def shard(items: Sequence[T], parts: int) -> list[list[T]]:
    """Split into `parts` contiguous chunks whose sizes differ by at most one.

    The first chunks get the extra items (like accelerate's split_between_processes), and
    nothing is padded or repeated: each item lands in exactly one chunk.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(len(items), parts)
    out: list[list[T]] = []
    start = 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out


def plan_for_rank(tasks: Sequence[ImageTask], layout: Layout) -> list[ImageTask]:
    """The images of this rank's data-parallel group (all ranks of a group render them all)."""
    return shard(tasks, layout.dp_degree)[layout.group_index]


class DataParallel:
    name: ClassVar[str] = Strategy.DATA_PARALLEL.value

    def group_size(self, spec: DiffusionJobSpec) -> int:
        return 1

    def validate(self, spec: DiffusionJobSpec, gpu: bool) -> None:
        return None

    def load_kwargs(self, spec: DiffusionJobSpec, gpu: bool) -> dict[str, Any]:
        return {}

    def preflight(self, spec: DiffusionJobSpec, source: str, revision: str | None,
                  gpu: bool) -> None:
        return None

    def check_model(self, pipe: Any, spec: DiffusionJobSpec) -> None:
        return None

    def place(self, pipe: Any, spec: DiffusionJobSpec, world: World) -> Any:
        return pipe.to(world.device)

    def parallelize(self, pipe: Any, spec: DiffusionJobSpec, world: World) -> Any:
        return pipe

    def prepare(self, pipe: Any, spec: DiffusionJobSpec, world: World) -> Any:
        return self.parallelize(self.place(pipe, spec, world), spec, world)

    def plan(self, tasks: Sequence[ImageTask], layout: Layout) -> list[ImageTask]:
        return plan_for_rank(tasks, layout)


class DeviceMap(DataParallel):
    """One process per pod, the pipeline's components spread over the pod's GPUs."""

    name: ClassVar[str] = Strategy.DEVICE_MAP.value

    def load_kwargs(self, spec: DiffusionJobSpec, gpu: bool) -> dict[str, Any]:
        if not gpu:
            # diffusers drops CPU entries from the map: on CPU it would be empty anyway.
            return {}
        dm = spec.parallelism.device_map
        kwargs: dict[str, Any] = {"device_map": dm.policy if dm else "balanced"}
        if dm and dm.max_memory:
            kwargs["max_memory"] = {
                (int(k) if k.isdigit() else k): v for k, v in dm.max_memory.items()
            }
        return kwargs

    def place(self, pipe: Any, spec: DiffusionJobSpec, world: World) -> Any:
        # A mapped pipeline refuses `.to()`; an unmapped one (CPU) already sits on the CPU.
        return pipe


def _transformer(pipe: Any, field: str) -> Any:
    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        raise PermanentFailure(
            field,
            f"{type(pipe).__name__} has no transformer (UNet pipelines support neither context "
            "nor tensor parallelism); use strategy DataParallel or DeviceMap",
        )
    return transformer


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
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    torch._C._get_accelerator = lambda: torch.device("cpu")
    try:
        yield
    finally:
        torch.accelerator.device_count = saved_count  # type: ignore[assignment]
        torch._C._get_accelerator = saved_get


class ContextParallel(DataParallel):
    """Groups of ring x ulysses consecutive ranks render each image together."""

    name: ClassVar[str] = Strategy.CONTEXT_PARALLEL.value
    FIELD = "spec.parallelism.contextParallel"

    def __init__(self) -> None:
        # diffusers' uneven-split mode (preflight.UNEVEN_*), set by preflight when needed.
        self.uneven = ""

    @staticmethod
    def _cp(spec: DiffusionJobSpec) -> ContextParallelSpec:
        return spec.parallelism.context_parallel or ContextParallelSpec()

    def group_size(self, spec: DiffusionJobSpec) -> int:
        return self._cp(spec).degree

    def validate(self, spec: DiffusionJobSpec, gpu: bool) -> None:
        from diffusers.models.attention_dispatch import (
            AttentionBackendName,
            _AttentionBackendRegistry,
        )

        cp = self._cp(spec)
        if cp.degree < 2:
            raise PermanentFailure(self.FIELD, "ringDegree x ulyssesDegree must be 2 or more")
        try:
            backend = AttentionBackendName(cp.attention_backend)
        except ValueError:
            known = ", ".join(sorted(b.value for b in AttentionBackendName))
            raise PermanentFailure(
                f"{self.FIELD}.attentionBackend",
                f"unknown attention backend {cp.attention_backend!r}; one of: {known}",
            ) from None
        if not _AttentionBackendRegistry._is_context_parallel_available(backend):
            ok = ", ".join(sorted(_AttentionBackendRegistry._supports_context_parallel))
            raise PermanentFailure(
                f"{self.FIELD}.attentionBackend",
                f"{cp.attention_backend!r} does not support context parallelism; use one of: {ok}",
            )
        if not gpu and cp.attention_backend not in CPU_BACKENDS:
            raise PermanentFailure(
                f"{self.FIELD}.attentionBackend",
                f"{cp.attention_backend!r} needs GPUs and this pod has none; on CPU use "
                "native with ulyssesDegree",
            )
        if cp.ring_degree > 1 and cp.attention_backend in NO_LSE_BACKENDS:
            raise PermanentFailure(
                f"{self.FIELD}.attentionBackend",
                f"ring attention (ringDegree {cp.ring_degree}) needs a backend that returns LSE "
                f"and {cp.attention_backend!r} does not; use flash or _native_cudnn on GPUs, or "
                "set ringDegree: 1 and use ulyssesDegree",
            )

    def preflight(self, spec: DiffusionJobSpec, source: str, revision: str | None,
                  gpu: bool) -> None:
        from .preflight import check_context_parallel

        cp, gen = self._cp(spec), spec.generation
        verdict = check_context_parallel(source, revision, gen.height, gen.width,
                                         gen.extra_args, cp.ring_degree, cp.ulysses_degree,
                                         allow_uneven=gpu)
        if verdict.problems:
            raise PermanentFailure(*verdict.problems[0])
        if verdict.uneven:
            import logging

            logging.getLogger("muralist").warning(
                "sequence lengths do not divide ring x ulysses %d: using diffusers' %s "
                "(uneven split, slightly more communication)", cp.degree, verdict.uneven)
        self.uneven = verdict.uneven

    def check_model(self, pipe: Any, spec: DiffusionJobSpec) -> None:
        cp = self._cp(spec)
        transformer = _transformer(pipe, "spec.parallelism.strategy")
        cls = type(transformer).__name__
        if getattr(transformer, "_cp_plan", None) is None:
            raise PermanentFailure(
                "spec.parallelism.strategy",
                f"{cls} has no context-parallel plan (_cp_plan) in diffusers; use DataParallel",
            )
        heads = getattr(transformer.config, "num_attention_heads", None)
        if cp.ulysses_degree > 1 and heads is not None and heads % cp.ulysses_degree:
            raise PermanentFailure(
                f"{self.FIELD}.ulyssesDegree",
                f"{cp.ulysses_degree} does not divide the {heads} attention heads of {cls}; use "
                f"a divisor of {heads}",
            )

    def _config(self, spec: DiffusionJobSpec, world: World) -> Any:
        from diffusers import ContextParallelConfig

        cp = self._cp(spec)
        # A (dp, ring, ulysses) mesh, so several CP groups coexist in one world; diffusers
        # gets the group's (ring, ulysses) sub-mesh instead of building one over the world.
        mesh = world.mesh((world.layout.dp_degree, cp.ring_degree, cp.ulysses_degree),
                          ("dp", "ring", "ulysses"))
        uneven = {self.uneven: True} if self.uneven else {}
        return ContextParallelConfig(ring_degree=cp.ring_degree, ulysses_degree=cp.ulysses_degree,
                                     mesh=mesh["ring", "ulysses"], **uneven)

    def place(self, pipe: Any, spec: DiffusionJobSpec, world: World) -> Any:
        pipe = pipe.to(world.device)
        pipe.transformer.set_attention_backend(self._cp(spec).attention_backend)
        return pipe

    def parallelize(self, pipe: Any, spec: DiffusionJobSpec, world: World) -> Any:
        with cpu_device_shim(world.device.type == "cuda"):
            pipe.transformer.enable_parallelism(config=self._config(spec, world))
        return pipe


class TensorParallel(ContextParallel):
    """Groups of `degree` consecutive ranks each hold a slice of every layer."""

    name: ClassVar[str] = Strategy.TENSOR_PARALLEL.value
    FIELD = "spec.parallelism.tensorParallel"

    @staticmethod
    def _tp(spec: DiffusionJobSpec) -> TensorParallelSpec:
        return spec.parallelism.tensor_parallel or TensorParallelSpec()

    def group_size(self, spec: DiffusionJobSpec) -> int:
        return self._tp(spec).degree

    def validate(self, spec: DiffusionJobSpec, gpu: bool) -> None:
        if not gpu:
            raise PermanentFailure(
                "spec.parallelism.gpusPerNode",
                "TensorParallel needs GPUs (diffusers refuses it on device type 'cpu'); set "
                "gpusPerNode or use DataParallel / ContextParallel",
            )

    def check_model(self, pipe: Any, spec: DiffusionJobSpec) -> None:
        degree = self._tp(spec).degree
        transformer = _transformer(pipe, "spec.parallelism.strategy")
        cls = type(transformer).__name__
        if getattr(transformer, "_tp_plan", None) is None:
            raise PermanentFailure(
                "spec.parallelism.strategy",
                f"{cls} has no tensor-parallel plan (_tp_plan) in diffusers; use DataParallel "
                "or ContextParallel",
            )
        heads = getattr(transformer.config, "num_attention_heads", None)
        if heads is not None and heads % degree:
            raise PermanentFailure(
                f"{self.FIELD}.degree",
                f"{degree} does not divide the {heads} attention heads of {cls}; use a divisor "
                f"of {heads}",
            )

    def _config(self, spec: DiffusionJobSpec, world: World) -> Any:
        from diffusers import TensorParallelConfig

        degree = self._tp(spec).degree
        mesh = world.mesh((world.layout.dp_degree, degree), ("dp", "tp"))
        return TensorParallelConfig(tp_degree=degree, mesh=mesh["tp"])

    def preflight(self, spec: DiffusionJobSpec, source: str, revision: str | None,
                  gpu: bool) -> None:
        return None  # heads are checked on the loaded model; TP splits no sequence

    def place(self, pipe: Any, spec: DiffusionJobSpec, world: World) -> Any:
        return pipe.to(world.device)


REGISTRY: dict[str, type[DataParallel]] = {
    cls.name: cls for cls in (DataParallel, DeviceMap, ContextParallel, TensorParallel)
}


def get_strategy(name: str) -> DataParallel:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise PermanentFailure(
            "spec.parallelism.strategy", f"unknown strategy {name!r}; one of {sorted(REGISTRY)}"
        ) from None
