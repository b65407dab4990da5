"""Context-parallel sequence rules: does a ring x ulysses group split this image evenly?

Context parallelism splits the image (or video) tokens, and for some models the text tokens,
along the sequence over the group's ring x ulysses ranks (and Ulysses also splits the
attention heads over ulyssesDegree). Which sequences are split is the transformer's
`_cp_plan` in diffusers: Flux's splits `encoder_hidden_states` too, Wan's only the video
tokens (the runtime's model/preflight.py reads the plan and passes `text_split`). diffusers' default
(equipartition) sharder needs each split sequence to divide evenly; a layout that does not
fails deep inside the first step, after minutes of loading. The lengths follow from the
transformer's and the VAE's config.json alone (the runtime's model/preflight.py reads them), so the
verdict takes a second.

Video: a clip of T frames is ((T - 1) / temporal + 1) latent frames (the VAE compresses
`temporal` frames into one after the first), each (H / spatial / patch) x (W / spatial /
patch) tokens, divided by the transformer's temporal patch: for Wan 2.1 (temporal 4, spatial
8, patch (1, 2, 2)) 81 frames at 480 x 832 are 21 x 30 x 52 = 32,760 tokens.

diffusers 0.42 can split uneven sequences ("Ulysses anything" for ring 1, "ring anything" for
ulysses 1, ContextParallelConfig.ulysses_anything / ring_anything): where one applies, the
runtime turns it on instead of refusing. With both degrees above 1 there is no uneven mode,
and without GPUs neither works (their size exchange allocates CUDA tensors: "Found no NVIDIA
driver" on a CPU machine), so there an uneven layout is refused too.

Pure and torch-free, like the rest of the rules catalog.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from muralist_api.cel import python_rule
from muralist_api.rules.catalog import CP_FIELD, Problem, heads_problems

# Pipelines that pack 2x2 latent patches into one token themselves (their transformer's
# config says patch_size 1): Flux, Flux 2 and Qwen-Image.
PACKING_TRANSFORMERS = {
    "FluxTransformer2DModel": 2,
    "Flux2Transformer2DModel": 2,
    "QwenImageTransformer2DModel": 2,
}
# Text length when extraArgs has no max_sequence_length (Flux's T5 default).
DEFAULT_TEXT_TOKENS = 512
UNEVEN_NONE, UNEVEN_ULYSSES, UNEVEN_RING = "", "ulysses_anything", "ring_anything"


@dataclass(frozen=True)
class SequenceLengths:
    """Token counts of one image's attention, per sequence that context parallelism splits."""

    latent_height: int  # in tokens (after VAE downsampling and patch packing)
    latent_width: int
    text_tokens: int
    latent_frames: int = 1  # video: token frames (after the VAE's temporal compression and patching)
    text_split: bool = True  # whether the transformer's _cp_plan splits the text tokens too

    @property
    def image_tokens(self) -> int:
        return self.latent_frames * self.latent_height * self.latent_width

    def describe(self) -> str:
        """"3 x 2 x 2 = 12 tokens" (video) or "4 x 4 = 16 tokens" (image)."""
        sides = f"{self.latent_height} x {self.latent_width}"
        if self.latent_frames > 1:
            return f"video sequence {self.latent_frames} x {sides} = {self.image_tokens} tokens"
        return f"image sequence {sides} = {self.image_tokens} tokens"


def vae_scale_factor(vae_config: dict[str, Any]) -> int:
    """2 ** (len(block_out_channels) - 1), as diffusers' image pipelines compute it."""
    return int(2 ** (len(vae_config.get("block_out_channels", [0])) - 1))


def vae_scales(vae_config: dict[str, Any]) -> tuple[int, int]:
    """(spatial, temporal) compression of a VAE config, as the pipelines compute them.

    AutoencoderKLWan records scale_factor_spatial / _temporal (older configs only
    temperal_downsample, sic); AutoencoderKLLTXVideo derives them from its patch sizes and
    spatio_temporal_scaling; image VAEs compress 2 ** (blocks - 1) in space and not in time.
    """
    if "temperal_downsample" in vae_config or "scale_factor_spatial" in vae_config:
        down = vae_config.get("temperal_downsample") or [False, True, True]
        spatial = vae_config.get("scale_factor_spatial") or 2 ** len(down)
        temporal = vae_config.get("scale_factor_temporal") or 2 ** sum(bool(d) for d in down)
        return int(spatial), int(temporal)
    if "spatio_temporal_scaling" in vae_config:
        scaling = sum(bool(s) for s in vae_config["spatio_temporal_scaling"])
        spatial = vae_config.get("spatial_compression_ratio") or vae_config.get("patch_size", 4) * 2 ** scaling
        temporal = vae_config.get("temporal_compression_ratio") or vae_config.get("patch_size_t", 1) * 2 ** scaling
        return int(spatial), int(temporal)
    return vae_scale_factor(vae_config), 1


def temporal_patch(transformer_config: dict[str, Any]) -> int:
    """Latent frames per token: patch_size[0] of (t, h, w) patches (Wan), else patch_size_t (LTX)."""
    size = transformer_config.get("patch_size", 1)
    if isinstance(size, list | tuple):
        return max(1, int(size[0]))
    return max(1, int(transformer_config.get("patch_size_t") or 1))


def token_frames(num_frames: int, temporal_scale: int, patch_t: int = 1) -> int:
    """Token frames of a clip: (T - 1) // temporal + 1 latent frames (the pipelines' rounding), / patch."""
    return max(1, ((num_frames - 1) // temporal_scale + 1) // patch_t)


def patch_size(transformer_config: dict[str, Any]) -> int:
    """Latent pixels per token side: the pipeline's packing, else the config's patch_size."""
    packing = PACKING_TRANSFORMERS.get(str(transformer_config.get("_class_name", "")))
    if packing:
        return packing
    size = transformer_config.get("patch_size", 1)
    if isinstance(size, list | tuple):  # video transformers: (t, h, w)
        size = size[-1]
    return max(1, int(size))


def sequence_lengths(height: int, width: int, vae_scale: int, patch: int,
                     text_tokens: int = DEFAULT_TEXT_TOKENS, frames: int = 1,
                     text_split: bool = True) -> SequenceLengths:
    """Image tokens = frames x (H / vae / patch) x (W / vae / patch) (the pipelines round down);
    `frames` are token frames (token_frames), 1 for images."""
    side = vae_scale * patch
    return SequenceLengths(height // side, width // side, text_tokens, frames, text_split)


def text_tokens(extra_args: dict[str, Any], default: int = DEFAULT_TEXT_TOKENS) -> int:
    """max_sequence_length from extraArgs, else `default` (the pipeline's own default)."""
    value = extra_args.get("max_sequence_length", default)
    return int(value) if isinstance(value, int) and value > 0 else default


@dataclass(frozen=True)
class Verdict:
    """problems: (field, message) to refuse with; uneven: the diffusers mode to turn on."""

    problems: list[Problem]
    uneven: str = UNEVEN_NONE


def _multiple_hint(degree: int, side: int) -> str:
    return f"use height and width multiples of {degree * side}"


@python_rule(no_cel="reads the model's config and the sequence lengths it gives: the runtime checks it on the machine")
def cp_problems(lengths: SequenceLengths, heads: int | None, ring: int, ulysses: int,
                side: int = 1, allow_uneven: bool = True) -> Verdict:
    """Check a ring x ulysses layout against the lengths; `side` = pixels per token side.

    `allow_uneven`: whether diffusers' uneven modes may be used (GPU only).
    """
    degree = ring * ulysses
    problems = heads_problems(heads, ulysses, f"{CP_FIELD}.ulyssesDegree", "the model")
    uneven: list[Problem] = []
    if lengths.image_tokens % degree:
        hint = _multiple_hint(degree, side)
        if lengths.latent_frames > 1:
            hint += " (or another numFrames)"
        uneven.append(("spec.generation.height",
                       f"{lengths.describe()} is not divisible by ringDegree x ulyssesDegree {degree}; {hint}"))
    if lengths.text_split and lengths.text_tokens % degree:
        uneven.append(("spec.generation.extraArgs.max_sequence_length",
                       f"text sequence of {lengths.text_tokens} tokens is not divisible by "
                       f"ringDegree x ulyssesDegree {degree}; use a multiple of {degree}"))
    if not uneven:
        return Verdict(problems)
    if not allow_uneven:
        return Verdict(problems + [(f, m + " (uneven splits need GPUs)") for f, m in uneven])
    if ring == 1 and ulysses > 1:
        return Verdict(problems, UNEVEN_ULYSSES)
    if ulysses == 1 and ring > 1:
        return Verdict(problems, UNEVEN_RING)
    return Verdict(problems + uneven)
