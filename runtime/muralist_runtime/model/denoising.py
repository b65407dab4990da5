"""A pipeline call's denoising state at a step boundary, and a call resumed from it (runPolicy.checkpoint).

What the steps after step k read, besides the model's weights and the call's arguments:
- the latents after step k (the step callback's `latents`);
- the scheduler's state: its step index, sigmas and timesteps, and what a multistep solver keeps of the steps
  before (every attribute of the scheduler object but its config);
- the random generators' states: each item's CPU generator, and torch's own (a stochastic sampler draws from it
  when the pipeline hands it no generator);
- the prompt embeddings, which the resumed call computes again from the same prompt, as the uninterrupted call
  did (the item's request digest, which the checkpoint carries, pins the prompt and the model).

A resumed call is the same pipeline call with `latents=` the saved latents and each generator set to its saved
state. The pipeline's denoising loop asks its `interrupt` property at the top of every step and skips the step
when it says so; `make_resumable` gives the pipeline's class a property that says so for the k steps the
checkpoint holds and, at the top of step k, puts the scheduler's and torch's states back. From there the call
computes what the uninterrupted call computed (tests/runtime/test_runtime_denoising.py: bit for bit, on each
of the catalog's RESUMABLE_PIPELINES). A pipeline that reads its latents another way (FluxInpaintPipeline blends
the image back in with its first step's noise) is not in that list, and the job is refused (`check_resumable`).

The render layer attaches an `ItemDenoising` to the pipeline for the call of one item (`attached`); call.py's
`_call` hands the call's kwargs to `prepare`, which does nothing for a call with none attached (the canary, the
warm-up). torch is imported inside the functions that use it.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.rules.workloads import CHECKPOINT_FIELD, RESUMABLE_PIPELINES, not_resumable
from muralist_api.runtime_spec import RuntimeSpec

from .settled import twin_class

_ITEM = "_muralist_item_denoising"  # the pipeline's attribute holding the attached ItemDenoising
_SKIP = "_muralist_resume"  # the pipeline's attribute holding the steps a resumed call has left to skip
_CONFIG = "_internal_dict"  # a scheduler's config (ConfigMixin): fixed by the spec, not state
_DEVICE = "device"  # a saved tensor: {"tensor": t, "device": its device type}
_TENSOR = "tensor"


class NotCapturable(Exception):
    """A value of a scheduler's state that a checkpoint cannot hold (it holds tensors and plain values)."""


@dataclass
class DenoisingState:
    """One call's state after `step` of its `steps` denoising steps (one item: runPolicy.checkpoint needs
    batchSize 1), every tensor on the CPU."""

    step: int
    steps: int
    latents: Any
    scheduler: dict[str, Any]
    generators: list[Any]
    rng: Any
    cuda_rng: list[Any] | None = None

    def payload(self) -> dict[str, Any]:
        """What a checkpoint file holds of it (tensors and plain values: torch.load(weights_only=True) reads it)."""
        return {"step": self.step, "steps": self.steps, "latents": self.latents, "scheduler": self.scheduler,
                "generators": self.generators, "rng": self.rng, "cudaRng": self.cuda_rng}

    @classmethod
    def from_payload(cls, doc: dict[str, Any]) -> DenoisingState:
        return cls(int(doc["step"]), int(doc["steps"]), doc["latents"], dict(doc["scheduler"]),
                   list(doc["generators"]), doc["rng"], doc.get("cudaRng"))


def _saved(value: Any, where: str) -> Any:
    """A scheduler value as a checkpoint holds it: tensors on the CPU (with the kind of device they were on)."""
    import torch

    if isinstance(value, torch.Tensor):
        return {_TENSOR: value.detach().to("cpu", copy=True), _DEVICE: value.device.type}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        items = [_saved(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _saved(v, f"{where}.{k}") for k, v in value.items()}
    raise NotCapturable(f"{where} is a {type(value).__name__}")


def _restored(value: Any, device: Any) -> Any:
    import torch

    if isinstance(value, dict) and set(value) == {_TENSOR, _DEVICE}:
        tensor: torch.Tensor = value[_TENSOR]
        return tensor.to(device) if value[_DEVICE] != "cpu" else tensor.clone()
    if isinstance(value, list | tuple):
        items = [_restored(v, device) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _restored(v, device) for k, v in value.items()}
    return value


def scheduler_state(scheduler: Any) -> dict[str, Any]:
    """Every attribute of a scheduler but its config, as a checkpoint holds it; NotCapturable names one that
    it cannot hold."""
    name = type(scheduler).__name__
    return {k: _saved(v, f"{name}.{k}") for k, v in vars(scheduler).items() if k != _CONFIG}


def capture(pipe: Any, step: int, steps: int, latents: Any, generators: list[Any]) -> DenoisingState:
    """The call's state at the end of its step `step` - 1 (from its step callback)."""
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return DenoisingState(step, steps, latents.detach().to("cpu", copy=True), scheduler_state(pipe.scheduler),
                          [g.get_state() for g in generators], torch.get_rng_state(), cuda)


class _Skip:
    """A resumed call's first `left` steps, skipped; at the top of the next one the states are put back."""

    def __init__(self, state: DenoisingState):
        self.state = state
        self.left = state.step

    def skip(self, pipe: Any) -> bool:
        if self.left > 0:
            self.left -= 1
            return True
        import torch

        device = pipe._execution_device
        pipe.scheduler.__dict__.update(_restored(self.state.scheduler, device))
        torch.set_rng_state(self.state.rng)
        if self.state.cuda_rng is not None and torch.cuda.is_available() and \
                len(self.state.cuda_rng) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(self.state.cuda_rng)
        pipe.__dict__.pop(_SKIP, None)
        return False


def _interrupt(self: Any) -> bool:
    resume = self.__dict__.get(_SKIP)
    if resume is not None and resume.skip(self):
        return True
    return bool(self._interrupt)


_RESUMABLE: dict[type, type] = {}


def make_resumable(pipe: Any) -> None:
    """Give the pipeline its class's resumable twin: the same class, whose `interrupt` also skips the steps a
    resumed call's checkpoint holds (nothing else changes: its name, signature and behaviour otherwise)."""
    base = type(pipe)
    if base in _RESUMABLE.values():
        return
    if base not in _RESUMABLE:
        _RESUMABLE[base] = twin_class(base, {"interrupt": property(_interrupt)})
    pipe.__class__ = _RESUMABLE[base]


def pipeline_name(pipe: Any) -> str:
    """The pipeline's class name (its own, not its resumable twin's: they are the same)."""
    return type(pipe).__name__


def check_resumable(pipe: Any, runtime: RuntimeSpec) -> None:
    """Refuse (exit 78, naming the option) a loaded pipeline or scheduler whose item a checkpoint cannot resume
    exactly: what admission could not know by name (a model without a known pipeline, the scheduler's state)."""
    name = pipeline_name(pipe)
    if name not in RESUMABLE_PIPELINES:
        raise PermanentFailure(CHECKPOINT_FIELD, not_resumable(name))
    params = inspect.signature(pipe.__call__).parameters
    if "latents" not in params or "callback_on_step_end" not in params or \
            "latents" not in getattr(pipe, "_callback_tensor_inputs", ()) or \
            not isinstance(getattr(type(pipe), "interrupt", None), property):
        raise PermanentFailure(CHECKPOINT_FIELD, f"this {name} does not hand its latents to a step callback or take "
                               "them back (another diffusers version?); remove runPolicy.checkpoint")
    scheduler = copy.deepcopy(pipe.scheduler)
    with contextlib.suppress(Exception):  # some need more than a step count (Flux's dynamic shift: mu)
        scheduler.set_timesteps(runtime.spec.generation.steps)
    try:
        scheduler_state(scheduler)
    except NotCapturable as e:
        field = "spec.generation.scheduler" if runtime.spec.generation.scheduler is not None else CHECKPOINT_FIELD
        raise PermanentFailure(field, f"{e}, which a checkpoint cannot hold (it holds tensors and plain values), so "
                               f"an item could not resume where it was; use another scheduler, or remove "
                               "runPolicy.checkpoint") from None


class NotResumed(RuntimeError):
    """The pipeline did not skip the steps of a resumed call as its checkpoint says (a failure of the item)."""


@dataclass
class StepEnd:
    """The end of one denoising step of an item's call: `step` steps of `steps` done; `capture` makes the
    DenoisingState (a copy of the latents to the CPU: called when a checkpoint is due, not every step)."""

    step: int
    steps: int
    capture: Callable[[], DenoisingState]


@dataclass
class ItemDenoising:
    """What an item's call does with its denoising state: where it resumes (None: from the start) and what each
    step's end does (the checkpoint policy's: model/checkpointing.py)."""

    resume: DenoisingState | None
    on_step_end: Callable[[StepEnd], None]


@contextlib.contextmanager
def attached(pipe: Any, item: ItemDenoising) -> Iterator[None]:
    """The item's denoising attached to the pipeline for its call (`prepare` reads it), removed after."""
    pipe.__dict__[_ITEM] = item
    try:
        yield
    finally:
        pipe.__dict__.pop(_ITEM, None)
        pipe.__dict__.pop(_SKIP, None)


def prepare(pipe: Any, kwargs: dict[str, Any]) -> None:
    """The call's kwargs for the attached item (none attached: unchanged): its saved latents and generator
    states when it resumes, and a step callback that hands each step's end to the item's policy after the
    callback already there (the progress heartbeat)."""
    item: ItemDenoising | None = pipe.__dict__.get(_ITEM)
    if item is None:
        return
    generators: list[Any] = list(kwargs.get("generator") or [])
    resume = item.resume
    if resume is not None:
        if len(generators) != len(resume.generators):
            raise NotResumed(f"the checkpoint holds {len(resume.generators)} generators, the call has "
                             f"{len(generators)}")
        kwargs["latents"] = resume.latents
        for generator, saved in zip(generators, resume.generators, strict=True):
            generator.set_state(saved)
        pipe.__dict__[_SKIP] = _Skip(resume)
    before = kwargs.get("callback_on_step_end")
    steps = int(kwargs.get("num_inference_steps") or 0)
    first = [True]

    def callback(p: Any, i: int, t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = before(p, i, t, tensors) if before is not None else tensors
        if first[0]:
            first[0] = False
            if resume is not None and i != resume.step:
                raise NotResumed(f"{pipeline_name(p)} rendered step {i} first where the checkpoint resumes at step "
                                 f"{resume.step}")
        total = int(getattr(p, "_num_timesteps", 0) or steps)
        latents = out.get("latents", tensors["latents"])
        item.on_step_end(StepEnd(i + 1, total, lambda: capture(p, i + 1, total, latents, generators)))
        return out

    kwargs["callback_on_step_end"] = callback
    inputs = list(kwargs.get("callback_on_step_end_tensor_inputs") or ["latents"])
    kwargs["callback_on_step_end_tensor_inputs"] = inputs if "latents" in inputs else [*inputs, "latents"]
