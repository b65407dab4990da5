"""The memory a layout needs on each device, estimated from the model's facts and the job's size.

Three parts, each one a formula a reader can check by hand (docs/concepts/strategies.md#memory):

- **weights**: the bytes of the components on the device at the job's dtype (a tensor-parallel
  rank holds 1/degree of the denoiser);
- **activations** of the denoiser at the job's sequence length: tokens from height, width and
  frames through the VAE's compression and the denoiser's patching (rules/sequence.py, as the
  context-parallel checks count them), plus the text tokens of joint-attention models. Per call,
  a block holds about `tokens x (6 x hidden + 2 x ffn)` elements (input, norm, q, k, v, attention
  out; the feed-forward's inner width twice); context parallelism divides the tokens, tensor
  parallelism the heads and the feed-forward. A fused attention backend (flash, cuDNN, PyTorch's
  SDPA) never holds the scores; the others add `heads x tokens x tokens` twice (scores, softmax);
- **the VAE decode**: `frames in flight x height x width x the decoder's first width x 10` (the
  last up-blocks at full resolution, measured on diffusers' decoders); with `vaeTiling` height and
  width are one tile's, plus the decoded output itself.

The peak is the weights plus the larger of activations and decode (the decode runs after the last
step). A device is counted as `USABLE` of its memory: the rest is the CUDA context, the
allocator's caches and NCCL's buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from muralist_api.planner.device import gib
from muralist_api.planner.facts import JOB_DTYPE_BYTES, ModelFacts
from muralist_api.rules.sequence import (
    DEFAULT_TEXT_TOKENS,
    SequenceLengths,
    patch_size,
    sequence_lengths,
    temporal_patch,
    token_frames,
    vae_scales,
)

USABLE = 0.90
VAE_DECODE_FACTOR = 10
# Pipelines that batch the unconditional prediction with the conditional one (classifier-free
# guidance doubles the denoiser's batch); the others call it twice, or are guidance-distilled.
CFG_BATCHED = frozenset({"StableDiffusionPipeline", "StableDiffusionXLPipeline", "StableDiffusion3Pipeline"})
# Denoisers that attend over image and text tokens together (the text is part of the sequence).
JOINT_ATTENTION = frozenset({"FluxTransformer2DModel", "Flux2Transformer2DModel", "QwenImageTransformer2DModel",
                             "SD3Transformer2DModel"})
# Frames of a video pipeline when the job leaves numFrames to it (the pipelines' defaults).
DEFAULT_FRAMES = {"WanPipeline": 81, "WanImageToVideoPipeline": 81, "LTXPipeline": 161,
                  "LTXImageToVideoPipeline": 161}
# The side of one tile of a tiled decode: diffusers' default for each VAE class (AutoencoderKL's is
# its config's sample_size).
TILE_SIDES = {"AutoencoderKLWan": 256, "AutoencoderKLQwenImage": 256, "AutoencoderKLLTXVideo": 512}


@dataclass(frozen=True)
class Workload:
    """What one pipeline call renders, as far as memory cares."""

    height: int
    width: int
    num_frames: int | None = None
    batch: int = 1
    text_tokens: int = DEFAULT_TEXT_TOKENS
    vae_tiling: bool = False
    dtype: str = "bfloat16"
    fused_attention: bool = True


@dataclass(frozen=True)
class Sequence:
    lengths: SequenceLengths
    tokens: int  # what attention runs over: image tokens, and the text for joint attention
    side: int  # pixels per token side (VAE x patch)
    frames: int  # frames decoded (1 for images)
    temporal: int  # the VAE's temporal compression (1 for images)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one device."""

    weights: int
    activations: int
    vae_decode: int

    @property
    def peak(self) -> int:
        return self.weights + max(self.activations, self.vae_decode)

    def describe(self) -> str:
        return (f"weights {gib(self.weights)} + max(activations {gib(self.activations)}, VAE decode "
                f"{gib(self.vae_decode)}) = {gib(self.peak)}")


def sequence(facts: ModelFacts, work: Workload) -> Sequence | None:
    """The denoiser's sequence at this size; None without a denoiser and a VAE config to count it."""
    denoiser, vae = facts.denoiser, facts.vae
    if denoiser is None or vae is None:
        return None
    config = {**denoiser.config, "_class_name": denoiser.class_name}
    spatial, temporal = vae_scales(dict(vae.config))
    frames, token_frame_count = 1, 1
    if temporal > 1:
        frames = work.num_frames or DEFAULT_FRAMES.get(facts.pipeline or "", 1)
        token_frame_count = token_frames(frames, temporal, temporal_patch(config))
    patch = patch_size(config)
    joint = denoiser.class_name in JOINT_ATTENTION
    lengths = sequence_lengths(work.height, work.width, spatial, patch, work.text_tokens, token_frame_count,
                               text_split=joint)
    tokens = lengths.image_tokens + (lengths.text_tokens if joint else 0)
    return Sequence(lengths, tokens, spatial * patch, frames, temporal)


def activations(facts: ModelFacts, work: Workload, split_sequence: int = 1, split_tensors: int = 1) -> int:
    """The denoiser's activations on one device: the sequence split `split_sequence` ways (context
    parallel), its heads and feed-forward `split_tensors` ways (tensor parallel)."""
    seq = sequence(facts, work)
    hidden, ffn, heads = facts.hidden, facts.ffn, facts.heads or 1
    if seq is None or hidden is None or ffn is None:
        return 0
    batch = work.batch * (2 if facts.pipeline in CFG_BATCHED else 1)
    elements = seq.tokens / split_sequence * (2 * hidden + (4 * hidden + 2 * ffn) / split_tensors)
    if not work.fused_attention:
        elements += 2 * max(1, heads // (split_tensors * split_sequence)) * seq.tokens * seq.tokens
    return int(batch * elements * JOB_DTYPE_BYTES[work.dtype])


def vae_decode(facts: ModelFacts, work: Workload) -> int:
    """The decode of one call's outputs (every rank of a group decodes the whole item)."""
    vae = facts.vae
    if vae is None:
        return 0
    config = dict(vae.config)
    widths = config.get("block_out_channels")
    width = widths[0] if isinstance(widths, list) and widths else config.get("base_dim", 128)
    seq = sequence(facts, work)
    frames, temporal = (seq.frames, seq.temporal) if seq is not None else (1, 1)
    height, width_px = work.height, work.width
    if work.vae_tiling:
        tile = TILE_SIDES.get(vae.class_name) or _side(config.get("sample_size")) or 512
        height, width_px = min(height, tile), min(width_px, tile)
    dtype = JOB_DTYPE_BYTES[work.dtype]
    in_flight = height * width_px * int(width) * VAE_DECODE_FACTOR * min(frames, temporal)
    output = frames * 3 * work.height * work.width
    return int(work.batch * (in_flight + output) * dtype)


def _side(value: object) -> int | None:
    if isinstance(value, list | tuple) and value:
        value = value[0]
    return int(value) if isinstance(value, int) and value > 0 else None


def estimate(facts: ModelFacts, work: Workload, weights: int, split_sequence: int = 1, split_tensors: int = 1,
             denoiser_here: bool = True, vae_here: bool = True) -> MemoryEstimate:
    """One device's estimate: `weights` on it, the denoiser's activations if it runs here, the
    decode if the VAE runs here."""
    act = activations(facts, work, split_sequence, split_tensors) if denoiser_here else 0
    return MemoryEstimate(weights, act, vae_decode(facts, work) if vae_here else 0)


def usable(memory: int) -> int:
    return int(memory * USABLE)
