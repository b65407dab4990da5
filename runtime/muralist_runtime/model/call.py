"""One call of the loaded pipeline per batch: what the pipeline takes (checked before generating, on
every rank alike: `check_call`), a batch's kwargs (`call_kwargs`: one CPU generator per item, seeded by
the item, and its input images), and the call itself with its outputs checked (`render_checked`: an
item whose text, inputs or output is bad fails alone, with its reason).

The claim loop renders through `render_checked`; the canary, MagCache's calibration, the cache gate and
the compile's warm-up through `render` / `render_checked` as well, so every render of a run is the one
the job's items get.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.items import Item, text_problem
from muralist_api.rules.workloads import IMAGE_FORMATS, VIDEO_FORMATS
from muralist_api.runtime_spec import RuntimeSpec

from ..outputs.layouts import RenderedOutput
from ..outputs.media import frames_to_uint8
from ..testing.faults import nan_rows
from . import denoising
from .inputs import InputError, load_inputs


def call_parameters(pipe: Any) -> Any:
    """The parameters `pipe(...)` takes: looked up once per pipeline class (several times a call otherwise, ~50 us
    each)."""
    if "__call__" in getattr(pipe, "__dict__", {}):
        return inspect.signature(pipe.__call__).parameters
    return _class_call_parameters(pipe.__class__)


@functools.lru_cache(maxsize=32)
def _class_call_parameters(cls: Any) -> Any:
    return inspect.signature(cls.__call__).parameters


def renders_video(pipe: Any) -> bool:
    """Video pipelines take num_frames (Wan, LTX, ...) and return `.frames`."""
    return "num_frames" in call_parameters(pipe)


def needs_image(pipe: Any) -> bool:
    """Pipelines whose `image` has no default (image-to-video) cannot render an item without one."""
    param = call_parameters(pipe).get("image")
    return param is not None and param.default is inspect.Parameter.empty


def check_call(pipe: Any, spec: Any) -> None:
    """Refuse, before generating, what the pipeline cannot take (every rank checks alike).

    Admission checks the pipelines it knows by name; this checks the loaded one, whatever it is.
    """
    accepted = call_parameters(pipe)
    name = type(pipe).__name__
    dataset = spec.dataset is not None
    negative = any(p.negative_prompt for p in spec.prompt_objects) or (
        dataset and spec.dataset.columns.negative_prompt is not None)
    if negative and "negative_prompt" not in accepted:
        field = "spec.dataset.columns.negativePrompt" if dataset else "spec.prompts"
        raise PermanentFailure(field, f"{name} takes no negative prompt; remove negativePrompt")
    fmt = spec.output.format
    if renders_video(pipe):
        if fmt not in VIDEO_FORMATS:
            raise PermanentFailure("spec.output.format",
                                   f"{name} renders videos; use mp4 (H.264), webp (animated) or gif")
    elif fmt not in IMAGE_FORMATS:
        raise PermanentFailure("spec.output.format", f"{name} renders images; use png, jpeg or webp")
    elif spec.generation.num_frames is not None:
        raise PermanentFailure("spec.generation.numFrames", f"{name} renders images, not videos; remove numFrames")
    elif dataset and spec.dataset.columns.num_frames is not None:
        raise PermanentFailure("spec.dataset.columns.numFrames",
                               f"{name} renders images, not videos; remove the numFrames column")
    for use, param in (("image", "image"), ("mask", "mask_image")):
        named = (getattr(spec.dataset.columns, use) is not None if dataset
                 else any(getattr(p, use) for p in spec.prompt_objects))
        if named and param not in accepted:
            field = f"spec.dataset.columns.{use}" if dataset else "spec.prompts"
            raise PermanentFailure(field, f"{name} takes no input {use}; set model.pipeline to an image-conditioned "
                                   "pipeline, or remove the inputs")


def call_kwargs(pipe: Any, runtime: RuntimeSpec, batch: Sequence[Item], steps: int | None = None,
                seed_offset: int = 0, inputs: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The pipeline call for one batch: one CPU generator per output, seeded by the item.

    CPU generators make the initial noise identical on every device and world size.
    `steps` and `seed_offset` are for the canary and warm-up calls, never for job outputs.
    `inputs`: each item's loaded input images (inputs.load_inputs), passed as `image` and
    `mask_image`; the items of one call share their strength (render_checked groups them).
    """
    import torch

    gen = runtime.spec.generation
    accepted = call_parameters(pipe)
    shape = batch[0].shape(gen)  # one per call (render_checked's groups)
    # extraArgs first: what the spec and the items decide is set after it (admission refuses those keys
    # in extraArgs: rules/workloads.py RESERVED_CALL_ARGS).
    kwargs: dict[str, Any] = dict(gen.extra_args)
    kwargs |= {
        "prompt": [t.prompt for t in batch],
        "num_inference_steps": steps or gen.steps,
        "guidance_scale": gen.guidance_scale,
        # Image-conditioned pipelines too: Flux img2img and inpaint would otherwise render at
        # the input image's size.
        "height": shape.height,
        "width": shape.width,
        "generator": [torch.Generator("cpu").manual_seed(t.seed + seed_offset) for t in batch],
    }
    per_prompt = "num_videos_per_prompt" if "num_videos_per_prompt" in accepted else "num_images_per_prompt"
    kwargs[per_prompt] = 1
    if any(t.negative_prompt for t in batch):
        kwargs["negative_prompt"] = [t.negative_prompt or "" for t in batch]
    if shape.num_frames is not None and "num_frames" in accepted:
        kwargs["num_frames"] = shape.num_frames
    kwargs.update(_input_kwargs(accepted, runtime, batch, inputs or [{} for _ in batch]))
    return kwargs


def _input_kwargs(accepted: Any, runtime: RuntimeSpec, batch: Sequence[Item],
                  inputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    shape = batch[0].shape(runtime.spec.generation)
    kontext = "_auto_resize" in accepted
    out: dict[str, Any] = {}
    if kontext:
        # FluxKontextPipeline otherwise picks a ~1024^2 resolution of its own whatever height
        # and width say: minutes per image where the job asked for seconds.
        out.update(_auto_resize=False, max_area=shape.height * shape.width)
    for field, param in (("image", "image"), ("mask", "mask_image")):
        images: list[Any] = [loaded.get(field) for loaded in inputs]
        if all(image is None for image in images):
            continue
        if kontext and field == "image":
            # Kontext conditions on the image at its own size (with _auto_resize off): at the
            # job's size its tokens, and so a context-parallel split, are known in advance.
            images = [image.resize((shape.width, shape.height)) for image in images]
        out[param] = images[0] if len(images) == 1 else images  # WanImageToVideoPipeline takes no list
    if batch and batch[0].strength is not None and "strength" in accepted:
        out["strength"] = batch[0].strength
    return out


StepHook = Callable[[], None]


def step_callback(pipe: Any, on_step: StepHook | None) -> dict[str, Any]:
    """`callback_on_step_end` kwargs that call `on_step` after each denoising step.

    This is the progress heartbeat (lastStepTime): a step that never ends is a stall even
    while the process is alive. Pipelines without the callback get no per-step signal.
    """
    if on_step is None:
        return {}
    if "callback_on_step_end" not in call_parameters(pipe):
        return {}

    def callback(_pipe: Any, _step: int, _timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        on_step()
        return tensors  # diffusers expects the (unchanged) tensors back

    return {"callback_on_step_end": callback}


def render(pipe: Any, runtime: RuntimeSpec, batch: Sequence[Item],
           on_step: StepHook | None = None, steps: int | None = None,
           seed_offset: int = 0) -> list[Any]:
    """Each item's layouts.RenderedOutput, or None where it failed (the canary and the warm-up use this)."""
    return [output for output, _ in render_checked(pipe, runtime, batch, on_step, steps, seed_offset)]


Checked = tuple[Any, str | None]  # (layouts.RenderedOutput, None), or (None, why the item failed)


def render_checked(pipe: Any, runtime: RuntimeSpec, batch: Sequence[Item], on_step: StepHook | None = None,
                   steps: int | None = None, seed_offset: int = 0, pad_to: int | None = None) -> list[Checked]:
    """Render a batch: each item's (layouts.RenderedOutput, None), or (None, why it cannot be used).

    An item fails on its own when its text is not valid Unicode (items.text_problem: a tokenizer
    would raise), its inputs cannot be read (inputs.InputError, naming the field and the path) or
    its output has NaN values. Items of different strengths or sizes, or with
    and without inputs, go in separate calls (a pipeline takes one strength and one size per call).
    `pad_to`: every call renders that many items (render/batching.py's call_size: a compiled graph's batch
    size), a short one padded with copies of its last item, whose outputs are dropped.
    """
    loaded: dict[str, dict[str, Any]] = {}
    results: dict[str, Checked] = {}
    needs = needs_image(pipe)
    for item in batch:
        bad_text = text_problem("prompt", item.prompt) or text_problem("negativePrompt", item.negative_prompt)
        if bad_text:
            results[item.key] = (None, bad_text)
            continue
        try:
            loaded[item.key] = load_inputs(runtime, item)
        except InputError as e:
            results[item.key] = (None, str(e))
            continue
        if needs and "image" not in loaded[item.key]:
            results[item.key] = (None, f"{type(pipe).__name__} needs an input image, and this item has none")
    for group in _call_groups([item for item in batch if item.key not in results], loaded):
        outputs = _call(pipe, runtime, group, [loaded[i.key] for i in group], on_step, steps, seed_offset, pad_to)
        results.update({item.key: result for item, result in zip(group, outputs, strict=True)})
    return [results[item.key] for item in batch]


def _call_groups(items: Sequence[Item], loaded: dict[str, dict[str, Any]]) -> list[list[Item]]:
    """Consecutive items that one call can take: the same strength, size (height, width, frames) and kinds
    of inputs (a call takes images for all its prompts or for none)."""
    groups: list[list[Item]] = []
    keys: list[tuple[Any, ...]] = []
    for item in items:
        key = (item.strength, item.height, item.width, item.num_frames, tuple(sorted(loaded[item.key])))
        if keys and keys[-1] == key:
            groups[-1].append(item)
        else:
            groups.append([item])
            keys.append(key)
    return groups


def _call(pipe: Any, runtime: RuntimeSpec, batch: Sequence[Item], inputs: Sequence[dict[str, Any]],
          on_step: StepHook | None, steps: int | None, seed_offset: int, pad_to: int | None = None) -> list[Checked]:
    """One pipeline call.

    The pipeline returns floats (output_type "np") so that a diverged sample (NaN) is caught
    instead of written as a black image; images are converted to 8 bits by the pipeline's own
    numpy_to_pil, video frames with the same rounding (media.frames_to_uint8).
    """
    import numpy as np
    import torch

    pad = max(0, (pad_to or 0) - len(batch))
    kwargs = call_kwargs(pipe, runtime, [*batch, *[batch[-1]] * pad], steps, seed_offset,
                         [*inputs, *[inputs[-1]] * pad])
    kwargs.update(step_callback(pipe, on_step))
    denoising.prepare(pipe, kwargs)  # an item with checkpoints: where it resumes, what its steps save
    as_numpy = "output_type" in call_parameters(pipe)
    if as_numpy:
        kwargs["output_type"] = "np"
    video = renders_video(pipe)
    with torch.inference_mode():
        result = pipe(**kwargs)
    arrays = (result.frames if video else result.images)[:len(batch)]  # the padding's dropped
    if not as_numpy:
        return [(RenderedOutput(frames=frames_to_uint8(a)) if video else RenderedOutput(image=a), None) for a in arrays]
    poisoned = nan_rows()
    out: list[Checked] = []
    for item, array, given in zip(batch, arrays, inputs, strict=True):
        if item.row in poisoned:
            array = np.full_like(array, np.nan)
        if not np.isfinite(array).all():
            out.append((None, "the output has NaN or infinite values (the sampler diverged)"))
        elif video:
            out.append((RenderedOutput(frames=frames_to_uint8(array), inputs=given), None))
        else:
            out.append((RenderedOutput(image=pipe.numpy_to_pil(array[None])[0], inputs=given), None))
    return out
