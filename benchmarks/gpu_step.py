#!/usr/bin/env python3
"""Seconds per denoising step of a full-size Flux transformer on one GPU: runtime vs plain loop.

    ~/.cache/muralist/venv/bin/python benchmarks/gpu_step.py [--steps 4 12] [--repeats 3]

Needs a CUDA device (exits 2 with a message without one) and ~30 GB of GPU memory; nothing is
downloaded. The transformer is FLUX.1-dev's architecture (its published config, hardcoded
below) with random weights, in bfloat16 on cuda, at 1024x1024: 4096 image tokens and 512 text
tokens. Two measurements on the same GPU, in one process:

- runtime: a FluxPipeline around that transformer (the text encoders and VAE are tiny random
  stand-ins with the right widths), called through `muralist_runtime.pipeline.render` with a
  RuntimeSpec, as a rank of the runtime calls it. Per step = (T(steps_b) - T(steps_a)) /
  (steps_b - steps_a), which cancels the fixed costs (text encoding, VAE decode, PIL images);
- plain: `transformer(...)` forward calls in a loop on the same-shaped inputs, timed with CUDA
  synchronisation, no scheduler.

The difference between the two is the runtime's (and diffusers' pipeline loop's) per-step
overhead on top of the model itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

# FLUX.1-dev transformer/config.json (black-forest-labs/FLUX.1-dev).
FLUX_DEV_TRANSFORMER = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": [16, 56, 56],
}
HEIGHT = WIDTH = 1024
IMAGE_TOKENS = (HEIGHT // 16) * (WIDTH // 16)  # 8x VAE, 2x2 packing: 4096
TEXT_TOKENS = 512  # FLUX.1-dev's max_sequence_length
GUIDANCE = 3.5


def require_cuda() -> None:
    try:
        import torch
    except ImportError:
        sys.exit(_refuse("torch is not installed"))
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        sys.exit(_refuse("no CUDA device is visible (torch.cuda.is_available() is False)"))


def _refuse(why: str) -> int:
    print(f"gpu_step.py: {why}; this benchmark needs one NVIDIA GPU with ~30 GB of memory",
          file=sys.stderr)
    return 2


def build_transformer() -> Any:
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 straight on the GPU: no fp32 copy
    try:
        with torch.device("cuda"):
            transformer = FluxTransformer2DModel(**FLUX_DEV_TRANSFORMER)
    finally:
        torch.set_default_dtype(previous)
    return transformer.eval()


def build_pipeline(transformer: Any) -> Any:
    """A FluxPipeline with the big transformer and tiny stand-ins of the right widths."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline
    from muralist_runtime.tiny import MAX_TOKENS, word_level_tokenizer
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    tokenizer, vocab = word_level_tokenizer(MAX_TOKENS)
    tokenizer_2, _ = word_level_tokenizer(TEXT_TOKENS)
    cfg = FLUX_DEV_TRANSFORMER
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=vocab, hidden_size=cfg["pooled_projection_dim"], intermediate_size=256,
        num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=MAX_TOKENS,
        projection_dim=cfg["pooled_projection_dim"], pad_token_id=0, bos_token_id=2,
        eos_token_id=2))
    text_encoder_2 = T5EncoderModel(T5Config(
        vocab_size=vocab, d_model=cfg["joint_attention_dim"], d_kv=64, d_ff=256, num_layers=1,
        num_heads=4, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=2,
        decoder_start_token_id=0))
    vae = AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(32, 32, 64, 64), layers_per_block=1, latent_channels=16,
        norm_num_groups=8, sample_size=HEIGHT, shift_factor=0.1159, scaling_factor=0.3611,
        use_quant_conv=False, use_post_quant_conv=False)
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                        text_encoder=text_encoder, tokenizer=tokenizer,
                        text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                        transformer=transformer)
    pipe.to("cuda", torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)  # as the runtime's load_pipeline does
    return pipe


def runtime_seconds(pipe: Any, steps: int, output_dir: str) -> float:
    """One image through the runtime's call path (pipeline.render), synchronised."""
    import torch
    from muralist_runtime import pipeline
    from muralist_runtime.spec import RuntimeSpec, image_tasks, parse_job

    job = parse_job({
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": "gpu-step"},
        "spec": {
            "model": {"name": "black-forest-labs/FLUX.1-dev", "dtype": "bfloat16",
                      "pipeline": "FluxPipeline"},
            "prompts": ["a lighthouse in a storm"],
            "generation": {"steps": steps, "guidanceScale": GUIDANCE, "height": HEIGHT,
                           "width": WIDTH, "seed": 0,
                           "extraArgs": {"max_sequence_length": TEXT_TOKENS}},
            "parallelism": {"strategy": "DataParallel", "gpusPerNode": 1},
        },
    })
    runtime = RuntimeSpec(name="gpu-step", spec=job.spec, output_dir=output_dir)
    tasks = image_tasks(job.spec.prompt_objects, job.spec.generation)
    torch.cuda.synchronize()
    start = time.perf_counter()
    pipeline.render(pipe, runtime, tasks)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def plain_step_seconds(transformer: Any, steps: int) -> list[float]:
    """Seconds of each of `steps` plain forward calls (after one warm-up call)."""
    import torch

    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(dev).manual_seed(0)
    hidden = torch.randn(1, IMAGE_TOKENS, FLUX_DEV_TRANSFORMER["in_channels"], device=dev,
                         dtype=dt, generator=g)
    text = torch.randn(1, TEXT_TOKENS, FLUX_DEV_TRANSFORMER["joint_attention_dim"], device=dev,
                       dtype=dt, generator=g)
    pooled = torch.randn(1, FLUX_DEV_TRANSFORMER["pooled_projection_dim"], device=dev, dtype=dt,
                         generator=g)
    side = HEIGHT // 16
    img_ids = torch.zeros(side, side, 3, device=dev, dtype=dt)
    img_ids[..., 1] = torch.arange(side, device=dev)[:, None]
    img_ids[..., 2] = torch.arange(side, device=dev)[None, :]
    img_ids = img_ids.reshape(IMAGE_TOKENS, 3)
    txt_ids = torch.zeros(TEXT_TOKENS, 3, device=dev, dtype=dt)
    guidance = torch.full((1,), GUIDANCE, device=dev, dtype=torch.float32)
    times: list[float] = []
    with torch.inference_mode():
        for i in range(steps + 1):
            timestep = torch.full((1,), 1.0 - i / (steps + 1), device=dev, dtype=dt)
            torch.cuda.synchronize()
            start = time.perf_counter()
            transformer(hidden_states=hidden, encoder_hidden_states=text,
                        pooled_projections=pooled, timestep=timestep, img_ids=img_ids,
                        txt_ids=txt_ids, guidance=guidance, return_dict=False)
            torch.cuda.synchronize()
            if i:  # the first call pays for kernel selection and allocator growth
                times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs=2, default=[4, 12], metavar=("A", "B"),
                        help="two step counts for the runtime's differential timing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    a, b = args.steps
    if b <= a or a < 1:
        parser.error("--steps A B needs 1 <= A < B")
    require_cuda()

    import torch

    name = torch.cuda.get_device_name()
    transformer = build_transformer()
    params = sum(p.numel() for p in transformer.parameters())
    pipe = build_pipeline(transformer)
    print(f"{name}; transformer {params / 1e9:.2f} B parameters, bf16; {HEIGHT}x{WIDTH} "
          f"({IMAGE_TOKENS} image + {TEXT_TOKENS} text tokens)", flush=True)

    plain = plain_step_seconds(transformer, 2 * b)
    with tempfile.TemporaryDirectory(prefix="muralist-gpu-step-") as out:
        runtime_seconds(pipe, a, out)  # warm-up: kernels, allocator, tokenizers
        per_step = []
        for _ in range(args.repeats):
            t_a = runtime_seconds(pipe, a, out)
            t_b = runtime_seconds(pipe, b, out)
            per_step.append((t_b - t_a) / (b - a))
    plain_med, runtime_med = statistics.median(plain), statistics.median(per_step)
    print("\n| path | s/step (median) | spread |")
    print("|---|---:|---|")
    print(f"| plain transformer forward ({len(plain)} calls) | {plain_med:.4f} | "
          f"{min(plain):.4f}-{max(plain):.4f} |")
    print(f"| runtime pipeline.render ({args.repeats} x steps {a} vs {b}) | {runtime_med:.4f} | "
          f"{min(per_step):.4f}-{max(per_step):.4f} |")
    print(f"\nruntime / plain: {runtime_med / plain_med:.3f}; peak GPU memory "
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
