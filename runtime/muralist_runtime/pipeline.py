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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .spec import TINY_MODEL_NAMES, ImageTask, PermanentFailure, RuntimeSpec

log = logging.getLogger("muralist.pipeline")


def tiny_cache_dir(name: str) -> Path:
    """Where a built-in tiny model is built: MURALIST_CACHE, else under HF_HOME, else ~/.cache."""
    base = os.environ.get("MURALIST_CACHE")
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


def check_call(pipe: Any, tasks: Sequence[ImageTask]) -> None:
    """Refuse, before generating, prompts the pipeline cannot take (every rank checks alike)."""
    accepted = inspect.signature(pipe.__call__).parameters
    if any(t.negative_prompt for t in tasks) and "negative_prompt" not in accepted:
        raise PermanentFailure(
            "spec.prompts", f"{type(pipe).__name__} takes no negative prompt; remove negativePrompt"
        )


def call_kwargs(pipe: Any, runtime: RuntimeSpec, batch: Sequence[ImageTask]) -> dict[str, Any]:
    """The pipeline call for one batch: one CPU generator per image, seeded by the task.

    CPU generators make the initial noise identical on every device and world size.
    """
    import torch

    gen = runtime.spec.generation
    kwargs: dict[str, Any] = {
        "prompt": [t.prompt for t in batch],
        "num_inference_steps": gen.steps,
        "guidance_scale": gen.guidance_scale,
        "height": gen.height,
        "width": gen.width,
        "num_images_per_prompt": 1,
        "generator": [torch.Generator("cpu").manual_seed(t.seed) for t in batch],
    }
    if any(t.negative_prompt for t in batch):
        kwargs["negative_prompt"] = [t.negative_prompt or "" for t in batch]
    kwargs.update(gen.extra_args)
    return kwargs


def render(pipe: Any, runtime: RuntimeSpec, batch: Sequence[ImageTask]) -> list[Any]:
    import torch

    with torch.inference_mode():
        return list(pipe(**call_kwargs(pipe, runtime, batch)).images)
