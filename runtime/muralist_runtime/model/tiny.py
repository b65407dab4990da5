"""Tiny random-weight pipelines and LoRA adapters, built offline (`muralist tiny-pipeline DIR`).

Quickstarts, tests and demos need real diffusers pipelines without a hub download. These have
the real classes at toy sizes, so every code path of the runtime (from_pretrained,
set_attention_backend, enable_parallelism, load_lora_weights) runs for real:

- "muralist/tiny-flux": FluxPipeline (FluxTransformer2DModel with its CP and TP plans, CLIP
  and T5 encoders, AutoencoderKL, flow-matching scheduler);
- "muralist/tiny-wan": WanPipeline, text to video (WanTransformer3DModel with its CP plan,
  UMT5 encoder, AutoencoderKLWan);
- "muralist/tiny-wan-i2v": WanImageToVideoPipeline in the Wan 2.2 layout (no CLIP image
  encoder: the image reaches the transformer only as VAE latents concatenated to the noise).

Every build is deterministic (fixed seeds, fixed vocabulary), so every rank that builds one in
place gets identical weights; it is then saved with `save_pretrained` and loaded back with the
ordinary `from_pretrained`, like any other model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Heads: 2, so Ulysses 2 and TP 2 divide them; head dim 16 = sum(axes_dims_rope).
TRANSFORMER_CONFIG = {
    "patch_size": 1,
    "in_channels": 4,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 32,
    "axes_dims_rope": [4, 4, 8],
}
TEXT_HIDDEN = 32  # CLIP pooled width = pooled_projection_dim; T5 width = joint_attention_dim
MAX_TOKENS = 77  # CLIP's usual context; the pipeline pads both tokenizers to it
SEED = 0

# Wan: 2 heads so Ulysses 2 divides them. The VAE compresses 4x in time (two temporal
# downsamples) and 8x in space (three spatial ones), and the transformer patches (1, 2, 2), so
# a video of T = 4k+1 frames at HxW (multiples of 16) is ((T-1)/4 + 1) * (H/16) * (W/16)
# tokens: 12 at 9x32x32, 80 at 17x64x64 (both even, as Ulysses 2 needs).
WAN_LATENT_CHANNELS = 4
WAN_TEMPORAL_FACTOR = 4
WAN_TRANSFORMER_CONFIG = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": WAN_LATENT_CHANNELS,
    "out_channels": WAN_LATENT_CHANNELS,
    "text_dim": TEXT_HIDDEN,
    "freq_dim": 32,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 32,
}
WAN_MAX_TOKENS = 64
# Words in the vocabulary; anything else maps to [UNK], which is fine for random weights.
_WORDS = (
    "a", "an", "the", "of", "in", "on", "with", "and", "at", "by", "dog", "cat", "fox", "owl",
    "bird", "fish", "horse", "robot", "castle", "city", "house", "tree", "forest", "mountain",
    "river", "sea", "sky", "sun", "moon", "star", "night", "day", "red", "blue", "green",
    "yellow", "white", "black", "gold", "silver", "painting", "photo", "watercolor", "sketch",
    "portrait", "landscape", "mural", "wall", "street", "garden", "lighthouse", "storm",
    "rain", "snow", "cloud", "flower", "boat", "ship", "train", "car", "bridge", "tower",
)
_MARKER = "model_index.json"
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"  # diffusers' default, found by load_lora_weights
LORA_TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")
# Multiplies the LoRA's B matrices. At 1 the tiny LoRA moves pixels by ~0.013 (3/255), about what changing the
# prompt does to this random model; at 8 by ~0.2, far above float noise and PNG rounding.
LORA_SCALE = 8


def word_level_tokenizer(max_length: int, words: Sequence[str] = _WORDS) -> tuple[Any, int]:
    """A fast tokenizer over a small in-memory vocabulary (no download), and its vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(words)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        eos_token="</s>",
        model_max_length=max_length,
    ), len(vocab)


def t5_config_kwargs(vocab_size: int) -> dict[str, Any]:
    # Shared by Flux's T5 and Wan's UMT5 (same architecture family, same toy size).
    return {
        "vocab_size": vocab_size,
        "d_model": TEXT_HIDDEN,
        "d_kv": 16,
        "d_ff": 64,
        "num_layers": 1,
        "num_heads": 2,
        "relative_attention_num_buckets": 8,
        "pad_token_id": 0,
        "eos_token_id": 2,
        "decoder_start_token_id": 0,
    }


def write_tiny_flux(directory: Path) -> None:
    """Save the tiny Flux pipeline into `directory` (no atomicity: see build_tiny)."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    tokenizer, vocab_size = word_level_tokenizer(MAX_TOKENS)
    tokenizer_2, _ = word_level_tokenizer(MAX_TOKENS)

    # One seed per component: adding a component never changes another one's weights.
    torch.manual_seed(SEED)
    transformer = FluxTransformer2DModel(**TRANSFORMER_CONFIG)
    torch.manual_seed(SEED + 1)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=vocab_size,
            hidden_size=TEXT_HIDDEN,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=MAX_TOKENS,
            projection_dim=TEXT_HIDDEN,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=2,
        )
    )
    torch.manual_seed(SEED + 2)
    text_encoder_2 = T5EncoderModel(T5Config(**t5_config_kwargs(vocab_size)))
    torch.manual_seed(SEED + 3)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        block_out_channels=(8,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=8,
        sample_size=32,
        # Flux's decode shifts and scales the latents: both must be set.
        shift_factor=0.0609,
        scaling_factor=1.5035,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    ).save_pretrained(directory)


def _wan_components(in_channels: int) -> dict[str, Any]:
    """The parts common to the tiny Wan pipelines; only the transformer's input width differs."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer, vocab_size = word_level_tokenizer(WAN_MAX_TOKENS)
    torch.manual_seed(SEED)
    transformer = WanTransformer3DModel(**{**WAN_TRANSFORMER_CONFIG, "in_channels": in_channels})
    torch.manual_seed(SEED + 1)
    text_encoder = UMT5EncoderModel(UMT5Config(**t5_config_kwargs(vocab_size)))
    torch.manual_seed(SEED + 2)
    vae = AutoencoderKLWan(
        base_dim=4,
        z_dim=WAN_LATENT_CHANNELS,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],  # sic (diffusers' spelling): 4x in time
        # The pipeline normalises latents with these: one entry per latent channel.
        latents_mean=[0.0] * WAN_LATENT_CHANNELS,
        latents_std=[1.0] * WAN_LATENT_CHANNELS,
    )
    return {
        "tokenizer": tokenizer,
        "text_encoder": text_encoder,
        "vae": vae,
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
        "transformer": transformer,
    }


def write_tiny_wan(directory: Path) -> None:
    """Save the tiny Wan text-to-video pipeline into `directory`."""
    from diffusers import WanPipeline

    WanPipeline(**_wan_components(WAN_LATENT_CHANNELS)).save_pretrained(directory)


def write_tiny_wan_i2v(directory: Path) -> None:
    """Save the tiny Wan image-to-video pipeline (Wan 2.2 layout, no image encoder).

    Its transformer reads the noise latents, a first-frame mask (one channel per frame of a
    temporal VAE step) and the image's VAE latents, concatenated: 4 + 4 + 4 channels. Without
    `image_dim` in the transformer config the pipeline never calls a CLIP image encoder.
    """
    from diffusers import WanImageToVideoPipeline

    in_channels = 2 * WAN_LATENT_CHANNELS + WAN_TEMPORAL_FACTOR
    WanImageToVideoPipeline(**_wan_components(in_channels)).save_pretrained(directory)


TINY_BUILDERS: dict[str, Callable[[Path], None]] = {
    "muralist/tiny-flux": write_tiny_flux,
    "muralist/tiny-wan": write_tiny_wan,
    "muralist/tiny-wan-i2v": write_tiny_wan_i2v,
}


def _publish(directory: str | os.PathLike[str], write: Callable[[Path], None], marker: str) -> Path:
    """Run `write` into a sibling temp dir and rename it to `directory`; kept if already complete.

    Concurrent builders (several ranks sharing a cache) and a killed build never leave a
    half-written directory behind: the rename is atomic, so `marker` in `directory` means a
    complete build.
    """
    target = Path(directory).resolve()
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(staging)
        # transformers saves only on rank 0 once torch.distributed is initialised: refuse to
        # publish a directory without its weights rather than fail later in from_pretrained.
        missing = [d.name for d in staging.iterdir() if d.is_dir() and not any(d.iterdir())]
        if missing or not (staging / marker).exists():
            raise RuntimeError(f"tiny build of {target.name} left {missing or [marker]} empty or missing "
                               "(build it before torch.distributed.init_process_group)")
        try:
            os.replace(staging, target)
        except OSError:
            # Another builder won the race (target now a non-empty dir): theirs is identical.
            if not (target / marker).exists():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def build_tiny(name: str, directory: str | os.PathLike[str]) -> Path:
    """Build the tiny pipeline `name` (a key of TINY_BUILDERS) into `directory`; return its path."""
    try:
        write = TINY_BUILDERS[name]
    except KeyError:
        raise ValueError(f"no tiny pipeline {name!r}; known: {sorted(TINY_BUILDERS)}") from None
    return _publish(directory, write, _MARKER)


def build_tiny_pipeline(directory: str | os.PathLike[str]) -> Path:
    """Build the tiny Flux pipeline into `directory` (kept if already complete); return its path."""
    return build_tiny("muralist/tiny-flux", directory)


def build_tiny_lora(
    pipeline_dir: str | os.PathLike[str],
    directory: str | os.PathLike[str],
    seed: int = 0,
    rank: int = 4,
) -> Path:
    """Build a random LoRA for the tiny Flux pipeline at `pipeline_dir` into `directory`.

    `init_lora_weights=False` makes both LoRA matrices random (peft's default zeroes B, which
    would be a no-op adapter), so loading it visibly changes the image. Deterministic for a given
    pipeline and seed (byte-identical files). Saved with FluxPipeline.save_lora_weights, the
    layout load_lora_weights expects.
    """

    def write(staging: Path) -> None:
        import torch
        from diffusers import FluxPipeline
        from peft import LoraConfig, get_peft_model_state_dict

        pipe = FluxPipeline.from_pretrained(pipeline_dir, dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(LORA_TARGET_MODULES),
                            init_lora_weights=False)
        torch.manual_seed(seed)
        pipe.transformer.add_adapter(config)
        layers = get_peft_model_state_dict(pipe.transformer)
        # The scale goes into B rather than into lora_alpha: without adapter metadata a reload
        # takes alpha = r, and with it the file is not reproducible (safetensors writes its
        # metadata map in a per-process random order, and the map records peft's version).
        layers = {k: v * LORA_SCALE if ".lora_B." in k else v for k, v in layers.items()}
        FluxPipeline.save_lora_weights(staging, transformer_lora_layers=layers)

    return _publish(directory, write, LORA_WEIGHT_NAME)
