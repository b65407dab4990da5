"""Context-parallel sequence rules: does a ring x ulysses group split this image evenly?

Context parallelism splits the image tokens and the text tokens along the sequence over the
group's ring x ulysses ranks (and Ulysses also splits the attention heads over ulyssesDegree).
diffusers' default (equipartition) sharder needs each to divide evenly; a layout that does not
fails deep inside the first step, after minutes of loading. The lengths follow from the
transformer's and the VAE's config.json alone (runtime/preflight.py reads them), so the
verdict takes a second.

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

from .catalog import CP_FIELD, Problem, heads_problems

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

    @property
    def image_tokens(self) -> int:
        return self.latent_height * self.latent_width


def vae_scale_factor(vae_config: dict[str, Any]) -> int:
    """2 ** (len(block_out_channels) - 1), as diffusers' image pipelines compute it."""
    return 2 ** (len(vae_config.get("block_out_channels", [0])) - 1)


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
                     text_tokens: int = DEFAULT_TEXT_TOKENS) -> SequenceLengths:
    """Image tokens = (H / vae / patch) x (W / vae / patch) (the pipelines round down)."""
    side = vae_scale * patch
    return SequenceLengths(height // side, width // side, text_tokens)


def text_tokens(extra_args: dict[str, Any]) -> int:
    value = extra_args.get("max_sequence_length", DEFAULT_TEXT_TOKENS)
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_TEXT_TOKENS


@dataclass(frozen=True)
class Verdict:
    """problems: (field, message) to refuse with; uneven: the diffusers mode to turn on."""

    problems: list[Problem]
    uneven: str = UNEVEN_NONE


def _multiple_hint(degree: int, side: int) -> str:
    return f"use height and width multiples of {degree * side}"


def cp_problems(lengths: SequenceLengths, heads: int | None, ring: int, ulysses: int,
                side: int = 1, allow_uneven: bool = True) -> Verdict:
    """Check a ring x ulysses layout against the lengths; `side` = pixels per token side.

    `allow_uneven`: whether diffusers' uneven modes may be used (GPU only).
    """
    degree = ring * ulysses
    problems = heads_problems(heads, ulysses, f"{CP_FIELD}.ulyssesDegree", "the model")
    uneven: list[Problem] = []
    if lengths.image_tokens % degree:
        uneven.append(("spec.generation.height",
                       f"image sequence {lengths.latent_height} x {lengths.latent_width} = "
                       f"{lengths.image_tokens} tokens is not divisible by ringDegree x "
                       f"ulyssesDegree {degree}; {_multiple_hint(degree, side)}"))
    if lengths.text_tokens % degree:
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
