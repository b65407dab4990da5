"""Pipeline loading and calling: the real `from_pretrained` for every kind of model name.

A model is a hub repo id (with revision and HF_TOKEN), a local directory, or a built-in tiny
name (spec.TINY_MODEL_NAMES) that is built in place into a cache directory first and then
loaded exactly like a local directory. `RuntimeSpec.model_path` (muralist run --model)
replaces the name with a local directory.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .spec import contract
from .spec.catalog import TINY_MODEL_NAMES
from .spec.contract import PermanentFailure
from .spec.items import Item
from .spec.resolved import RuntimeSpec

log = logging.getLogger("muralist.pipeline")


def tiny_cache_dir(name: str) -> Path:
    """Where a built-in tiny model is built: MURALIST_CACHE, else under HF_HOME, else ~/.cache."""
    base = os.environ.get(contract.MURALIST_CACHE)
    if base is None:
        hf_home = os.environ.get("HF_HOME")
        base = os.path.join(hf_home, "muralist") if hf_home else os.path.expanduser(
            "~/.cache/muralist/models")
    return Path(base) / name.replace("/", "--")


def resolve_model(runtime: RuntimeSpec) -> tuple[str, str | None]:
    """(what to pass to from_pretrained, revision); builds a tiny model when one is named.

    Call it before torch.distributed is initialised: transformers' save_pretrained writes
    nothing on ranks other than 0 once a process group exists, so a build racing on rank 1
    would miss its text encoders.
    """
    model = runtime.spec.model
    if runtime.model_path:
        return runtime.model_path, None
    if model.name in TINY_MODEL_NAMES:
        from .tiny import build_tiny_pipeline

        return str(build_tiny_pipeline(tiny_cache_dir(model.name))), None
    if model.name.startswith("/") and not Path(model.name).is_dir():
        raise PermanentFailure("spec.model.name", f"{model.name} is not a directory in the pod")
    return model.name, model.revision


def pipeline_class(name: str | None) -> Any:
    import diffusers

    if not name:
        return diffusers.DiffusionPipeline
    cls = getattr(diffusers, name, None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise PermanentFailure("spec.model.pipeline", f"diffusers has no pipeline class {name!r}")
    return cls


def load_pipeline(runtime: RuntimeSpec, source: str, revision: str | None, **kwargs: Any) -> Any:
    """`from_pretrained` of `source` (from resolve_model) with the spec's class and dtype."""
    import torch

    model = runtime.spec.model
    cls = pipeline_class(model.pipeline)
    if model.loading is not None and model.loading.no_mmap:
        # diffusers 0.42 takes disable_mmap at the pipeline level and hands it to every
        # component's load_state_dict: safetensors are read whole, not page-faulted in.
        kwargs["disable_mmap"] = True
    pipe = cls.from_pretrained(
        source,
        revision=revision,
        token=os.environ.get("HF_TOKEN") or None,
        dtype=getattr(torch, model.dtype),
        **kwargs,
    )
    # The runtime prints its own progress; diffusers' per-step bars would interleave.
    pipe.set_progress_bar_config(disable=True)
    return pipe


def check_call(pipe: Any, spec: Any) -> None:
    """Refuse, before generating, what the pipeline cannot take (every rank checks alike)."""
    accepted = inspect.signature(pipe.__call__).parameters
    negative = any(p.negative_prompt for p in spec.prompt_objects) or (
        spec.dataset is not None and spec.dataset.columns.negative_prompt is not None)
    if negative and "negative_prompt" not in accepted:
        field = "spec.dataset.columns.negativePrompt" if spec.dataset is not None else "spec.prompts"
        raise PermanentFailure(field, f"{type(pipe).__name__} takes no negative prompt; remove negativePrompt")


def call_kwargs(pipe: Any, runtime: RuntimeSpec, batch: Sequence[Item],
                steps: int | None = None, seed_offset: int = 0) -> dict[str, Any]:
    """The pipeline call for one batch: one CPU generator per image, seeded by the task.

    CPU generators make the initial noise identical on every device and world size.
    `steps` and `seed_offset` are for the canary and warm-up calls, never for job images.
    """
    import torch

    gen = runtime.spec.generation
    kwargs: dict[str, Any] = {
        "prompt": [t.prompt for t in batch],
        "num_inference_steps": steps or gen.steps,
        "guidance_scale": gen.guidance_scale,
        "height": gen.height,
        "width": gen.width,
        "num_images_per_prompt": 1,
        "generator": [torch.Generator("cpu").manual_seed(t.seed + seed_offset) for t in batch],
    }
    if any(t.negative_prompt for t in batch):
        kwargs["negative_prompt"] = [t.negative_prompt or "" for t in batch]
    kwargs.update(gen.extra_args)
    return kwargs


StepHook = Callable[[], None]


def step_callback(pipe: Any, on_step: StepHook | None) -> dict[str, Any]:
    """`callback_on_step_end` kwargs that call `on_step` after each denoising step.

    This is the progress heartbeat (lastStepTime): a step that never ends is a stall even
    while the process is alive. Pipelines without the callback get no per-step signal.
    """
    if on_step is None:
        return {}
    if "callback_on_step_end" not in inspect.signature(pipe.__call__).parameters:
        return {}

    def callback(_pipe: Any, _step: int, _timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        on_step()
        return tensors  # diffusers expects the (unchanged) tensors back

    return {"callback_on_step_end": callback}


def render(pipe: Any, runtime: RuntimeSpec, batch: Sequence[Item],
           on_step: StepHook | None = None, steps: int | None = None,
           seed_offset: int = 0) -> list[Any]:
    """One pipeline call; the outputs as PIL images (the canary and the warm-up use this)."""
    return [image for image, _ in render_checked(pipe, runtime, batch, on_step, steps, seed_offset)]


def render_checked(pipe: Any, runtime: RuntimeSpec, batch: Sequence[Item], on_step: StepHook | None = None,
                   steps: int | None = None, seed_offset: int = 0) -> list[tuple[Any, str | None]]:
    """One pipeline call; each output as (PIL image, None), or (None, why it is unusable).

    The pipeline returns floats (output_type "np") so that a diverged sample (NaN) is caught
    instead of written as a black image; the conversion to 8 bits is the pipeline's own.
    """
    import numpy as np
    import torch

    from .knobs import nan_rows

    kwargs = call_kwargs(pipe, runtime, batch, steps, seed_offset)
    kwargs.update(step_callback(pipe, on_step))
    as_numpy = "output_type" in inspect.signature(pipe.__call__).parameters
    if as_numpy:
        kwargs["output_type"] = "np"
    with torch.inference_mode():
        images = pipe(**kwargs).images
    if not as_numpy:
        return [(image, None) for image in images]
    poisoned = nan_rows()
    out: list[tuple[Any, str | None]] = []
    for item, array in zip(batch, images, strict=True):
        if item.row in poisoned:
            array = np.full_like(array, np.nan)
        if not np.isfinite(array).all():
            out.append((None, "the output has NaN or infinite values (the sampler diverged)"))
        else:
            out.append((pipe.numpy_to_pil(array[None])[0], None))
    return out


def compile_transformer(pipe: Any, parallel: bool) -> str:
    """Regional torch.compile of the transformer's repeated blocks; returns what was compiled.

    Compiling the repeated block once (diffusers' compile_repeated_blocks) instead of the whole
    model cuts compile time from minutes to tens of seconds for the same steady-state gain.
    Within a CP/TP group the blocks call collectives (all-to-all, DTensor), which may break the
    graph, so fullgraph is only demanded without parallelism.
    """
    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        return "nothing (no transformer)"
    if getattr(transformer, "_repeated_blocks", None):
        transformer.compile_repeated_blocks(fullgraph=not parallel)
        return f"repeated blocks {list(transformer._repeated_blocks)}"
    compiled = 0
    for name in ("transformer_blocks", "single_transformer_blocks"):
        for block in getattr(transformer, name, None) or []:
            block.compile(fullgraph=not parallel)
            compiled += 1
    return f"{compiled} blocks"


def enable_vae_tiling(pipe: Any) -> bool:
    """Tiled VAE decode. Every rank of a CP/TP group calls the pipeline, so every rank decodes
    with the same tiling and no rank waits on a collective the others skip."""
    vae = getattr(pipe, "vae", None)
    if vae is None or not hasattr(vae, "enable_tiling"):
        return False
    vae.enable_tiling()
    return True
