"""Train muralist/tiny-shapes-flux: a FluxPipeline at toy size that draws the shape it is asked for.

    export PYTHONPATH=$PWD/api:$PWD/cli:$PWD/operator:$PWD/runtime
    python hack/train_tiny_shapes.py                 # a full run into the committed folder (see --output)
    python hack/train_tiny_shapes.py --resume DIR --steps N --eval 90   # train DIR's transformer further
    python hack/train_tiny_shapes.py --quick --output /tmp/shapes   # a short run, to try changes
    python hack/train_tiny_shapes.py --evaluate DIR --eval 900 --seeds-from 3000000   # read back more seeds

The committed weights are what the first command wrote, in one run (eight stages of warm
restarts, the default --steps): docs/concepts/tiny-models.md has its timings, the adherence after
each stage and on 9,000 more seeds, and why the schedule has eight.

The data are the captioned images of muralist_runtime.model.shapes ("a red circle on a blue
background"). Every part is a real class of the Flux pipeline:

1. AutoencoderKL, trained alone first (reconstruction plus a small KL term) to map 64x64 images
   to 8x8x4 latents; its shift_factor and scaling_factor are then set from the latents' mean
   and spread, which is how the pipeline un-normalises them before decoding.
2. CLIP and T5 text encoders at toy size over a word-level vocabulary of the shapes world, left
   at their seeded random weights: each word still gets its own embedding, which is all the
   transformer needs to tell the captions apart.
3. FluxTransformer2DModel, trained by rectified flow exactly as FluxPipeline samples: the
   pipeline's own encode_prompt, _pack_latents and _prepare_latent_image_ids, latents
   x_s = (1 - s) x0 + s noise at sigma s, the timestep the pipeline passes (s = t / 1000), and
   the velocity noise - x0 as the target (FlowMatchEulerDiscreteScheduler steps along it).

Everything is seeded. At the end the pipeline (with the transformer's EMA weights) is saved
with save_pretrained, SHA256SUMS is written beside it, and the pipeline renders the evaluation
prompts (seeds training never used) and prints their adherence by pixel statistics.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from muralist_runtime.model import shapes
from muralist_runtime.model.tiny import t5_config_kwargs, word_level_tokenizer
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "runtime/muralist_runtime/model/weights/tiny-shapes-flux"
SUMS = "SHA256SUMS"
VALIDATION_SEED_START = 2 * shapes.EVALUATION_SEED_START
# Eight one-cycle stages, each restarting from the last one's EMA weights (a warm restart). Six
# scored 94.4 % on the tests' 90 seeds but 89.6 % on 9,000 fresh ones; eight 92.7 % there
# (docs/concepts/tiny-models.md).
STAGES = [3000, 2000, 2500, 3000, 3000, 3000, 3000, 3000]
TEXT_TOKENS = 8  # max_sequence_length: a caption is 7 words; 8 text + 16 image tokens stay even
TEXT_HIDDEN = 32
LATENT_CHANNELS = 4
# 64x64 images -> 8x8 latents (three 2x downsamples) -> 4x4 = 16 tokens of 2x2x4 = 16 channels.
VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (8, 16, 32, 32),
    "layers_per_block": 1,
    "latent_channels": LATENT_CHANNELS,
    # Several channels per group: with one (8 groups of the 8 full-size channels) GroupNorm
    # normalises each channel alone, and a flat colour (a channel's mean) barely passes through.
    "norm_num_groups": 2,
    "sample_size": shapes.SIZE,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}
# Heads even (Ulysses 2 and TP 2 divide them); head dim 16 = sum(axes_dims_rope).
TRANSFORMER_CONFIG: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 4 * LATENT_CHANNELS,
    "num_layers": 2,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": TEXT_HIDDEN,
    "pooled_projection_dim": TEXT_HIDDEN,
    "axes_dims_rope": (4, 6, 6),
}


def log(start: float, message: str) -> None:
    print(f"[{time.monotonic() - start:7.1f}s load {os.getloadavg()[0]:.2f}] {message}", flush=True)


def text_components(seed: int) -> dict[str, Any]:
    """Seeded random CLIP and T5 at toy size over the shapes vocabulary (frozen: never trained)."""
    tokenizer, vocab_size = word_level_tokenizer(77, shapes.VOCABULARY)
    tokenizer_2, _ = word_level_tokenizer(77, shapes.VOCABULARY)
    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=77, projection_dim=TEXT_HIDDEN, pad_token_id=0,
        bos_token_id=2, eos_token_id=2))
    torch.manual_seed(seed + 1)
    text_encoder_2 = T5EncoderModel(T5Config(**t5_config_kwargs(vocab_size)))
    return {"tokenizer": tokenizer, "text_encoder": text_encoder, "tokenizer_2": tokenizer_2,
            "text_encoder_2": text_encoder_2}


def images_tensor(scenes: list[shapes.Scene]) -> torch.Tensor:
    """(N, 3, H, W) in [-1, 1], the range the pipeline's image processor gives the VAE."""
    pixels = np.stack([shapes.draw(s) for s in scenes]).astype(np.float32) / 127.5 - 1
    return torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous()


def train_vae(vae: AutoencoderKL, images: torch.Tensor, steps: int, batch: int, generator: torch.Generator,
              start: float) -> None:
    """Reconstruction of the posterior's mean, plus a small KL term that keeps the latents near
    the origin. Sampling the posterior from the first step (its std starts near 1) hides the
    image under noise the encoder has not yet learnt to outgrow, and stalls training for
    hundreds of steps; the diffusion model only ever decodes, so the mean is what matters."""
    optimizer = torch.optim.Adam(vae.parameters(), lr=2e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=steps, pct_start=0.05)
    vae.train()
    for step in range(steps):
        x = images[torch.randint(len(images), (batch,), generator=generator)]
        posterior = vae.encode(x).latent_dist
        reconstruction = vae.decode(posterior.mean).sample
        kl = posterior.kl().mean() / posterior.mean[0].numel()
        loss = torch.nn.functional.mse_loss(reconstruction, x) + 1e-6 * kl
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # Clipped: at 3e-3 without it the loss jumped back up mid-run and ended worse.
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            log(start, f"vae step {step}/{steps} loss {loss.item():.4f} kl {kl.item():.3f}")
    vae.eval()


def to_uint8(images: torch.Tensor) -> list[Any]:
    """(N, 3, H, W) in [-1, 1] -> uint8 (H, W, 3) arrays, rounded as the pipeline's postprocess does."""
    pixels = ((images.permute(0, 2, 3, 1).numpy() + 1) / 2).clip(0, 1)
    return list(np.rint(pixels * 255).astype(np.uint8))


@torch.no_grad()
def encode_latents(vae: AutoencoderKL, images: torch.Tensor) -> torch.Tensor:
    return torch.cat([vae.encode(chunk).latent_dist.mode() for chunk in images.split(256)])


def train_transformer(pipe: FluxPipeline, latents: torch.Tensor, caption_index: torch.Tensor,
                      embeds: tuple[torch.Tensor, torch.Tensor, torch.Tensor], steps: int, batch: int,
                      generator: torch.Generator, start: float) -> dict[str, torch.Tensor]:
    """Rectified flow on packed latents; returns the EMA of the weights."""
    transformer = pipe.transformer
    prompt_embeds, pooled, text_ids = embeds
    _, channels, height, width = latents.shape
    image_ids = pipe._prepare_latent_image_ids(batch, height // 2, width // 2, "cpu", torch.float32)
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=1e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=steps, pct_start=0.05)
    ema = {k: v.detach().clone() for k, v in transformer.state_dict().items()}
    transformer.train()
    for step in range(steps):
        pick = torch.randint(len(latents), (batch,), generator=generator)
        x0 = pipe._pack_latents(latents[pick], batch, channels, height, width)
        noise = torch.randn(x0.shape, generator=generator)
        # Logit-normal sigmas (SD3's choice): most samples mid-way, where the content is decided.
        sigma = torch.sigmoid(torch.randn(batch, generator=generator))
        s = sigma[:, None, None]
        noisy = (1 - s) * x0 + s * noise
        index = caption_index[pick]
        velocity = transformer(
            hidden_states=noisy,
            timestep=sigma,  # FluxPipeline passes t / 1000, and its t is sigma * 1000
            guidance=None,
            pooled_projections=pooled[index],
            encoder_hidden_states=prompt_embeds[index],
            txt_ids=text_ids,
            img_ids=image_ids,
            return_dict=False,
        )[0]
        loss = torch.nn.functional.mse_loss(velocity, noise - x0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            for k, v in transformer.state_dict().items():
                ema[k].mul_(decay).add_(v.detach(), alpha=1 - decay)
        if step % 100 == 0 or step == steps - 1:
            log(start, f"transformer step {step}/{steps} loss {loss.item():.4f}")
    transformer.eval()
    return ema


def evaluate(pipe: FluxPipeline, count: int, steps: int,
             seeds_from: int = shapes.EVALUATION_SEED_START) -> tuple[float, list[Any]]:
    prompts = shapes.evaluation_prompts(count, seeds_from)
    images = []
    with torch.inference_mode():
        for chunk in range(0, count, 30):
            part = prompts[chunk:chunk + 30]
            images.extend(pipe(
                prompt=[p for p, _ in part], height=shapes.SIZE, width=shapes.SIZE, num_inference_steps=steps,
                generator=[torch.Generator("cpu").manual_seed(seed) for _, seed in part],
                max_sequence_length=TEXT_TOKENS, output_type="np",
            ).images)
    uint8 = [np.rint(np.clip(i, 0, 1) * 255).astype(np.uint8) for i in images]
    return shapes.adherence(zip([p for p, _ in prompts], uint8, strict=True)), uint8


def write_sums(folder: Path) -> None:
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(folder).as_posix()}"
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != SUMS]
    (folder / SUMS).write_text("\n".join(lines) + "\n")


def stage_steps(text: str) -> list[int]:
    steps = [int(n) for n in text.split(",")]
    if not steps or min(steps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: one or more positive step counts, comma-separated")
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--seed", type=int, default=0)
    # One thread: on a 2-core machine shared with other work, two threads ran a step 20x slower.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--images", type=int, default=10000, help="training images")
    parser.add_argument("--vae-steps", type=int, default=1000)
    parser.add_argument("--vae-batch", type=int, default=16)
    parser.add_argument("--steps", type=stage_steps, default=STAGES,
                        help="transformer steps, or steps per stage (each a warm restart): N or N,N,...")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--eval", type=int, default=180, help="evaluation prompts (unseen seeds)")
    parser.add_argument("--eval-steps", type=int, default=8, help="inference steps of the evaluation")
    parser.add_argument("--preview", type=Path, help="write the first 30 evaluation renders here (PNG)")
    parser.add_argument("--resume", type=Path, help="train the transformer of this earlier output further")
    parser.add_argument("--quick", action="store_true", help="a few minutes: fewer images and steps")
    parser.add_argument("--evaluate", type=Path, nargs="+", metavar="DIR",
                        help="train nothing: read back --eval renders of each folder, seeds from --seeds-from")
    parser.add_argument("--seeds-from", type=int, default=shapes.EVALUATION_SEED_START,
                        help=f"first seed of --evaluate (the tests': {shapes.EVALUATION_SEED_START:,}; validation's: "
                             f"{VALIDATION_SEED_START:,})")
    args = parser.parse_args()
    if args.quick:
        args.images, args.vae_steps, args.steps, args.eval = 4000, 150, [300], 60
    torch.set_num_threads(args.threads)
    start = time.monotonic()
    if args.evaluate:
        for folder in args.evaluate:
            pipe = FluxPipeline.from_pretrained(folder)
            pipe.set_progress_bar_config(disable=True)
            score, _ = evaluate(pipe, args.eval, args.eval_steps, seeds_from=args.seeds_from)
            log(start, f"{folder}: adherence {score:.1%} on {args.eval} prompts, seeds from {args.seeds_from:,}")
        return
    generator = torch.Generator("cpu").manual_seed(args.seed)

    scenes = shapes.training_scenes(args.images, args.seed)
    images = images_tensor(scenes)
    log(start, f"{len(scenes)} training images drawn")

    if args.resume:
        # Train the transformer of an earlier run further; its VAE and text encoders stay as they are.
        earlier = FluxPipeline.from_pretrained(args.resume)
        vae = earlier.vae
        vae.register_to_config(shift_factor=0.0, scaling_factor=1.0)
    else:
        torch.manual_seed(args.seed)
        vae = AutoencoderKL(**VAE_CONFIG)
        train_vae(vae, images, args.vae_steps, args.vae_batch, generator, start)
    raw = encode_latents(vae, images)
    with torch.no_grad():
        decoded = to_uint8(vae.decode(raw[:200]).sample)
    ceiling = shapes.adherence(zip([s.attributes.caption() for s in scenes[:200]], decoded, strict=True))
    log(start, f"VAE reconstructions adhere {ceiling:.1%} (the ceiling of what the transformer can reach)")
    # Decoding computes latents / scaling_factor + shift_factor: normalise to mean 0, spread 1.
    shift, scale = raw.mean().item(), 1 / raw.std().item()
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    latents = (raw - shift) * scale
    log(start, f"latents {tuple(latents.shape[1:])}, shift {shift:.4f} scale {scale:.4f}")

    torch.manual_seed(args.seed + 1)
    transformer = earlier.transformer if args.resume else FluxTransformer2DModel(**TRANSFORMER_CONFIG)
    text = ({k: getattr(earlier, k) for k in ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")}
            if args.resume else text_components(args.seed + 2))
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, transformer=transformer, **text)
    pipe.set_progress_bar_config(disable=True)
    captions = [a.caption() for a in shapes.all_attributes()]
    with torch.no_grad():
        prompt_embeds, pooled, text_ids = pipe.encode_prompt(prompt=captions, prompt_2=None,
                                                             max_sequence_length=TEXT_TOKENS)
    number = {c: i for i, c in enumerate(captions)}
    caption_index = torch.tensor([number[s.attributes.caption()] for s in scenes])
    assert latents.shape[1] == LATENT_CHANNELS
    log(start, f"transformer {sum(p.numel() for p in transformer.parameters()):,} parameters")
    for stage, steps in enumerate(args.steps):
        if stage:
            # What a --resume run of the previous stage's output does: the batches drawn again
            # from the seed, a fresh optimizer, one-cycle schedule and EMA (a warm restart).
            generator = torch.Generator("cpu").manual_seed(args.seed)
            torch.manual_seed(args.seed + 1)
            log(start, f"stage {stage + 1} of {len(args.steps)}: {steps} steps from the EMA weights")
        ema = train_transformer(pipe, latents, caption_index, (prompt_embeds, pooled, text_ids), steps,
                                args.batch, generator, start)
        transformer.load_state_dict(ema)
        if stage < len(args.steps) - 1:
            # Seeds of their own, neither training's nor the final evaluation's (which the tests use):
            # how far each stage got, without choosing anything by the evaluation's prompts.
            score, _ = evaluate(pipe, args.eval, args.eval_steps, seeds_from=VALIDATION_SEED_START)
            log(start, f"stage {stage + 1}: adherence {score:.1%} on {args.eval} validation seeds")

    args.output.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(args.output)
    write_sums(args.output)
    size = sum(p.stat().st_size for p in args.output.rglob("*.safetensors"))
    log(start, f"saved to {args.output} ({size / 2**20:.2f} MiB of safetensors)")
    score, rendered = evaluate(FluxPipeline.from_pretrained(args.output), args.eval, args.eval_steps)
    if args.preview:
        from PIL import Image

        rows = [np.concatenate(rendered[r:r + 10], 1) for r in range(0, min(30, len(rendered)) // 10 * 10, 10)]
        Image.fromarray(np.concatenate(rows)).save(args.preview)
    log(start, f"adherence {score:.1%} on {args.eval} unseen seeds at {args.eval_steps} steps; "
               f"trained in {math.ceil(time.monotonic() - start)} s with {args.threads} threads")


if __name__ == "__main__":
    main()
