"""spec.generation: the sampling settings of every image of a job (steps, size, seed, batch, video
frames), and the scheduler and step cache it renders with."""

from __future__ import annotations

from pydantic import Field

from muralist_api.base import ApiModel, KubeObject
from muralist_api.options import SchedulerSpec
from muralist_api.step_cache import CacheSpec


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
        description="torch.compile the transformer (its repeated blocks on a large model, whole and "
        "precompiled on a small one, with an image VAE's decoder), on a GPU or a CPU; one graph per "
        "size, compiled at its first call and kept in the compile cache beside the model cache, so "
        "that restarted, resized and added pods load it instead of compiling.",
    )
    num_frames: int | None = Field(
        None, ge=1, le=1025,
        description="Frames per video (video pipelines; Wan needs 4k+1, e.g. 81); default the pipeline's.",
    )
    fps: int = Field(16, ge=1, le=120, description="Frames per second of video outputs.")
    scheduler: SchedulerSpec | None = Field(None, description="Another scheduler than the pipeline's own.")
    cache: CacheSpec | None = Field(None, description="A step cache (diffusers cache hooks) for faster steps.")
