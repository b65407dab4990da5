"""The rules catalog, continued: workloads. Video families, pipelines that take input images,
schedulers and the call's extraArgs, as far as admission can know them without loading anything (the
step caches' catalog is the step cache's: muralist_api/step_cache.py).

Checked against the installed diffusers by tests/unit/api/rules/test_catalog.py (class names, config
fields); the runtime checks what only the loaded model can tell.
"""

from __future__ import annotations

from dataclasses import dataclass

from muralist_api.base import member_path
from muralist_api.cel import python_rule
from muralist_api.rules.catalog import Problem

# -- video -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoFamily:
    """What a video pipeline family needs of frames and sizes."""

    name: str
    frame_step: int  # frames must be frame_step * k + 1
    size_multiple: int
    default_frames: int


WAN = VideoFamily("Wan", 4, 16, 81)
LTX = VideoFamily("LTX-Video", 8, 32, 161)
VIDEO_PIPELINES: dict[str, VideoFamily] = {
    "WanPipeline": WAN,
    "WanImageToVideoPipeline": WAN,
    "LTXPipeline": LTX,
    "LTXImageToVideoPipeline": LTX,
}
VIDEO_FORMATS = frozenset({"mp4", "webp", "gif"})
IMAGE_FORMATS = frozenset({"png", "jpeg", "webp"})


@python_rule(no_cel=(
    "needs the rules catalog's pipelines (which render videos, their frame and size steps), which the CRD "
    "does not carry"
))
def video_problems(pipeline: str | None, num_frames: int | None, height: int, width: int,
                   fmt: str) -> list[Problem]:
    """A known pipeline's output kind and a video family's frame and size rules."""
    if pipeline is None:
        return [] if num_frames is None or fmt in VIDEO_FORMATS else [(
            "spec.output.format", f"{fmt} cannot hold a video (generation.numFrames is set); use mp4, webp or gif")]
    family = VIDEO_PIPELINES.get(pipeline)
    if family is None:
        out: list[Problem] = []
        if fmt not in IMAGE_FORMATS:
            out.append(("spec.output.format", f"{pipeline} renders images; use png, jpeg or webp"))
        if num_frames is not None:
            out.append(("spec.generation.numFrames", f"{pipeline} renders images, not videos; remove numFrames"))
        return out
    out = []
    if fmt not in VIDEO_FORMATS:
        out.append(("spec.output.format", f"{pipeline} renders videos; use mp4 (H.264), webp (animated) or gif"))
    if num_frames is not None and (num_frames - 1) % family.frame_step:
        k = max(1, round((num_frames - 1) / family.frame_step))
        out.append(("spec.generation.numFrames", f"{family.name} needs {family.frame_step}k+1 frames; {num_frames} "
                    f"is not: use {family.frame_step * k + 1}"))
    for name, size in (("height", height), ("width", width)):
        if size % family.size_multiple:
            fixed = max(family.size_multiple, round(size / family.size_multiple) * family.size_multiple)
            out.append((f"spec.generation.{name}", f"{family.name} needs multiples of {family.size_multiple}; "
                        f"{size} is not: use {fixed}"))
    return out


# -- input images ------------------------------------------------------------------------------

# Pipelines known to take an input image (and a mask); the runtime passes `image`,
# `mask_image` and `strength` from each item.
INPUT_PIPELINES: dict[str, frozenset[str]] = {
    "FluxImg2ImgPipeline": frozenset({"image"}),
    "FluxInpaintPipeline": frozenset({"image", "mask"}),
    "FluxKontextPipeline": frozenset({"image"}),
    "FluxKontextInpaintPipeline": frozenset({"image", "mask"}),
    "WanImageToVideoPipeline": frozenset({"image"}),
    "LTXImageToVideoPipeline": frozenset({"image"}),
    "StableDiffusionImg2ImgPipeline": frozenset({"image"}),
    "StableDiffusionInpaintPipeline": frozenset({"image", "mask"}),
    "StableDiffusionXLImg2ImgPipeline": frozenset({"image"}),
    "StableDiffusionXLInpaintPipeline": frozenset({"image", "mask"}),
}
# Text-only pipelines, and the image-conditioned pipelines of their family.
WITH_INPUTS = {
    "FluxPipeline": "FluxImg2ImgPipeline (image-to-image), FluxInpaintPipeline (with a mask) or FluxKontextPipeline "
                    "(instruction edits)",
    "WanPipeline": "WanImageToVideoPipeline",
    "LTXPipeline": "LTXImageToVideoPipeline",
    "StableDiffusionPipeline": "StableDiffusionImg2ImgPipeline or StableDiffusionInpaintPipeline",
    "StableDiffusionXLPipeline": "StableDiffusionXLImg2ImgPipeline or StableDiffusionXLInpaintPipeline",
}


@python_rule(no_cel="needs the rules catalog's pipelines (which take images and masks), which the CRD does not carry")
def input_problems(pipeline: str | None, uses: set[str], field_name: str) -> list[Problem]:
    """Items that carry `uses` ("image", "mask") on a pipeline known not to take them."""
    if pipeline is None or not uses:
        return []
    takes = INPUT_PIPELINES.get(pipeline)
    if takes is None and pipeline in WITH_INPUTS:
        return [(field_name, f"{pipeline} takes no input image; set model.pipeline to {WITH_INPUTS[pipeline]}")]
    if takes is not None and "mask" in uses and "mask" not in takes:
        return [(field_name, f"{pipeline} takes no mask; use an inpainting pipeline, or remove the masks")]
    return []


# -- the pipeline call ---------------------------------------------------------------------------

# Keyword arguments of a pipeline call that the spec or an item already decides, with the field that
# sets each. In generation.extraArgs they would bypass the spec's bounds and the determinism rule (a
# generator or latents of its own) or change what an item is behind its record's back, so they are
# refused there; the runtime sets them last all the same (model/call.py call_kwargs).
RESERVED_CALL_ARGS: dict[str, str] = {
    **dict.fromkeys(("prompt", "prompt_2", "prompt_3", "prompt_embeds", "pooled_prompt_embeds"),
                    "spec.prompts (or spec.dataset.columns.prompt)"),
    **dict.fromkeys(("negative_prompt", "negative_prompt_2", "negative_prompt_3", "negative_prompt_embeds",
                     "negative_pooled_prompt_embeds"),
                    "a prompt's negativePrompt (or spec.dataset.columns.negativePrompt)"),
    **dict.fromkeys(("generator", "seed", "latents"),
                    "spec.generation.seed, or a prompt's own seed (each item's noise comes from its seed)"),
    "num_inference_steps": "spec.generation.steps",
    "guidance_scale": "spec.generation.guidanceScale",
    "height": "spec.generation.height",
    "width": "spec.generation.width",
    "num_frames": "spec.generation.numFrames",
    **dict.fromkeys(("num_images_per_prompt", "num_videos_per_prompt"), "spec.generation.imagesPerPrompt"),
    **dict.fromkeys(("image", "mask_image", "strength"),
                    "a prompt's image, mask and strength (or the data set's columns) with spec.inputs"),
    **dict.fromkeys(("output_type", "return_dict"), "spec.output.format (the runtime reads the call's output)"),
    **dict.fromkeys(("callback_on_step_end", "callback_on_step_end_tensor_inputs"),
                    "nothing: the runtime's progress uses the step callback"),
}


@python_rule(no_cel=(
    "extraArgs is free-form (x-kubernetes-preserve-unknown-fields), and CEL cannot see the keys of such an "
    "object; `muralist validate` and the operator refuse such a job when they parse it"
))
def extra_args_problems(extra_args: dict[str, object]) -> list[Problem]:
    """Keys of generation.extraArgs that the spec or an item sets: each names the field to use instead."""
    return [(member_path("spec.generation.extraArgs", key),
             f"is set by the job, not by extraArgs; use {RESERVED_CALL_ARGS[key]}, and remove it from extraArgs")
            for key in extra_args if key in RESERVED_CALL_ARGS]


# -- schedulers --------------------------------------------------------------------------------

# Every scheduler class of diffusers 0.42.1 (tests/unit/api/rules/test_catalog.py compares).
SCHEDULERS = frozenset({
    "AmusedScheduler", "BlockRefinementScheduler", "CMStochasticIterativeScheduler", "CogVideoXDDIMScheduler",
    "CogVideoXDPMScheduler", "CosineDPMSolverMultistepScheduler", "DDIMInverseScheduler", "DDIMParallelScheduler",
    "DDIMScheduler", "DDPMParallelScheduler", "DDPMScheduler", "DDPMWuerstchenScheduler", "DEISMultistepScheduler",
    "DPMSolverMultistepInverseScheduler", "DPMSolverMultistepScheduler", "DPMSolverSDEScheduler",
    "DPMSolverSinglestepScheduler", "DiscreteDDIMScheduler", "EDMDPMSolverMultistepScheduler", "EDMEulerScheduler",
    "EntropyBoundScheduler", "EulerAncestralDiscreteScheduler", "EulerDiscreteScheduler",
    "FlowMapEulerDiscreteScheduler", "FlowMatchEulerDiscreteScheduler", "FlowMatchHeunDiscreteScheduler",
    "FlowMatchLCMScheduler", "HeliosDMDScheduler", "HeliosScheduler", "HeunDiscreteScheduler", "IPNDMScheduler",
    "KDPM2AncestralDiscreteScheduler", "KDPM2DiscreteScheduler", "KarrasVeScheduler", "LCMScheduler",
    "LMSDiscreteScheduler", "LTXEulerAncestralRFScheduler", "MiniMaxH3Scheduler", "PNDMScheduler",
    "PiflowScheduler", "RFD4ProteinaScheduler", "RePaintScheduler", "SASolverScheduler", "SCMScheduler",
    "ScoreSdeVeScheduler", "TCDScheduler", "UnCLIPScheduler", "UniPCMultistepScheduler", "VQDiffusionScheduler",
})


@python_rule(no_cel="needs the list of diffusers' schedulers, which the CRD does not carry")
def scheduler_problems(name: str) -> list[Problem]:
    if name in SCHEDULERS:
        return []
    close = sorted(s for s in SCHEDULERS if name.lower()[:5] in s.lower()) or sorted(SCHEDULERS)[:5]
    return [("spec.generation.scheduler.name", f"diffusers has no scheduler {name!r}; e.g. {', '.join(close[:5])}")]


# -- checkpoints inside an item ------------------------------------------------------------------

# Pipelines whose call resumes exactly from a checkpoint's state (runtime/muralist_runtime/model/denoising.py:
# the latents passed back in as they are, the steps before skipped at the top of the denoising loop, nothing
# else drawn from the generator): each is tested resumed against uninterrupted, bit for bit, on its tiny model
# (tests/runtime/test_runtime_denoising.py). FluxInpaintPipeline is not: it blends the image back in with
# the noise of its first step, which a resumed call no longer has.
RESUMABLE_PIPELINES = frozenset({
    "FluxPipeline", "FluxImg2ImgPipeline", "FluxKontextPipeline", "WanPipeline", "WanImageToVideoPipeline",
})
CHECKPOINT_FIELD = "spec.runPolicy.checkpoint"


def not_resumable(pipeline: str) -> str:
    """Why a checkpoint cannot resume a pipeline's item exactly (the runtime says the same of a loaded one)."""
    return (f"{pipeline} is not a pipeline whose resume from a checkpoint is verified exact (those are "
            f"{', '.join(sorted(RESUMABLE_PIPELINES))}); remove runPolicy.checkpoint, or use one of them")


@python_rule(no_cel="needs the rules catalog's pipelines (which resume exactly), which the CRD does not carry")
def checkpoint_pipeline_problems(pipeline: str | None) -> list[Problem]:
    """A known pipeline whose resume is not verified exact (an unknown one is the runtime's to check)."""
    if pipeline is None or pipeline in RESUMABLE_PIPELINES:
        return []
    return [(CHECKPOINT_FIELD, not_resumable(pipeline))]
