"""A tiny random-weight Flux pipeline, built offline (`muralist tiny-pipeline DIR`).

Quickstarts, tests and demos need a real diffusers pipeline without a hub download. This one
has the real classes (FluxPipeline, FluxTransformer2DModel with its CP and TP plans, CLIP and
T5 encoders, AutoencoderKL, flow-matching scheduler) at toy sizes, so every code path of the
runtime (from_pretrained, set_attention_backend, enable_parallelism) runs for real.

The build is deterministic (fixed seeds, fixed vocabulary), so every rank that builds it in
place gets identical weights; it is then saved with `save_pretrained` and loaded back with the
ordinary `from_pretrained`, like any other model.
"""

from __future__ import annotations

import os
import tempfile
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


def word_level_tokenizer(max_length: int) -> tuple[Any, int]:
    """A fast tokenizer over a small in-memory vocabulary (no download), and its vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(_WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        eos_token="</s>",
        model_max_length=max_length,
    ), len(vocab)


def _build(directory: Path) -> None:
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
    text_encoder_2 = T5EncoderModel(
        T5Config(
            vocab_size=vocab_size,
            d_model=TEXT_HIDDEN,
            d_kv=16,
            d_ff=64,
            num_layers=1,
            num_heads=2,
            relative_attention_num_buckets=8,
            pad_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=0,
        )
    )
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
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    pipe.save_pretrained(directory)
    # transformers saves only on rank 0 once torch.distributed is initialised: refuse to
    # publish a pipeline without its weights rather than fail later in from_pretrained.
    missing = [d.name for d in directory.iterdir() if d.is_dir() and not any(d.iterdir())]
    if missing:
        raise RuntimeError(f"tiny pipeline build left {missing} empty (build it before "
                           "torch.distributed.init_process_group)")


def build_tiny_pipeline(directory: str | os.PathLike[str]) -> Path:
    """Build the tiny pipeline into `directory` (kept if already complete); return its path.

    Built in a sibling temp dir and renamed into place, so concurrent builders (several ranks
    sharing a cache) and a killed build never leave a half-written pipeline behind.
    """
    target = Path(directory).resolve()
    if (target / _MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _build(staging)
        try:
            os.replace(staging, target)
        except OSError:
            # Another builder won the race (target now a non-empty dir): theirs is identical.
            if not (target / _MARKER).exists():
                raise
    finally:
        if staging.exists():
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return target
