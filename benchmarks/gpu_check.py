#!/usr/bin/env python3
"""The GPU proof: every GPU-only path of the runtime, exercised and timed in one run.

    bash hack/gpu-check.sh [--dry-run] [--out DIR]       # the way to run it (picks the interpreter)
    python benchmarks/gpu_check.py [--dry-run] [--out DIR] [--budget SECONDS]
    python benchmarks/gpu_check.py --table ROWS.jsonl [--killed-after SECONDS]   # re-print a table

Nothing is downloaded: every pipeline is built in place with random weights at real sizes
(FLUX.1-dev's transformer config in bfloat16, straight on the GPU; tiny stand-in text encoders
of the right widths; FLUX's VAE config for the tiling check; a small Flux for batching), and
the `muralist run` checks use the built-in muralist/tiny-flux. Each check is one function, has
its own time box (and the whole run a budget), and turns its own errors into FAIL rows:

- build: the random-weight pipelines on the device;
- render-path: `call.render_checked` with a RuntimeSpec and a rank's step callback (what a
  rank calls) vs a plain `pipe(...)` call with the same inputs vs a bare transformer forward
  loop. Per step = (T(B steps) - T(A steps)) / (B - A), which cancels the fixed costs (text
  encoding, VAE decode, PIL conversion). Target: runtime / plain call <= 1.03;
- attention: `transformer.set_attention_backend` for native, _native_cudnn, _native_flash,
  flash and sage; one step each, or n/a with diffusers' reason;
- cache: each step cache of muralist_api.step_cache.CACHES through its option mapping, enabled on the
  transformer (single process: before any parallelism), vs the uncached call: time ratio and
  PSNR of the 8-bit image vs the uncached one;
- batching: images/s of render_checked on the small Flux at batch 1, 2, 4, 8;
- vae-tiling: peak GPU memory (torch.cuda.max_memory_allocated) of a 2048x2048 decode with
  and without `loading.enable_vae_tiling`;
- muralist-run: `muralist run` of a DataParallel and a DeviceMap job (real launcher agent,
  torchrun, the runtime), outputs written, exit 0;
- per-item: `muralist run` of many small items (tiny-flux, one process, PNGs written) by its
  generateSeconds against the same items as bare `pipe()` calls in this process: what the
  runtime adds per item (target: the runtime at 0.95 of bare calls or better);
- compile: generation.compile through the runtime's own code (model/compiling.py: regional for
  FLUX.1-dev's 57 blocks), cold with an empty compile cache, then as a new pod starts (dynamo
  reset, inductor's in-memory caches cleared, an empty inductor folder) from the entry the cold
  compile wrote: compile time, graphs compiled and kernels built each time, and step time
  compiled vs not (last: it changes the transformer for good).

--dry-run is the same code on the CPU at toy sizes (float32, 1-2 steps, gpusPerNode 0), so
that it cannot rot between lent GPUs; what needs CUDA (memory figures, the CUDA-only attention
kernels) gets an explicit "skipped (dry run)" row. Compile runs on the CPU too (inductor's C++
backend), whole-transformer for the toy one.

Output: one Markdown table on stdout (path | setting | figure | verdict); with --out, also
gpu-check.md, gpu-check.jsonl (one row per line, written as the checks go) and the logs of the
`muralist run` jobs. Exit 1 when any row is FAIL, 2 when it cannot start (no CUDA without
--dry-run). A path this hardware or installation cannot run (flash-attn not installed) is "n/a"
with the reason: not a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# FLUX.1-dev transformer/config.json (black-forest-labs/FLUX.1-dev): ~11.9 B parameters.
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
# The small Flux of benchmarks/runtime_throughput.py (~36 M parameters): batching's subject.
SMALL_FLUX_TRANSFORMER = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 2,
    "num_single_layers": 4,
    "attention_head_dim": 64,
    "num_attention_heads": 8,
    "joint_attention_dim": 256,
    "pooled_projection_dim": 64,
    "axes_dims_rope": [16, 24, 24],
}
# The dry run's stand-in for both: FLUX.1-dev's shape (guidance embeds, 2x2 packing) at toy size.
TINY_TRANSFORMER = {
    "patch_size": 1,
    "in_channels": 16,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 32,
    "guidance_embeds": True,
    "axes_dims_rope": [4, 4, 8],
}
# FLUX.1-dev vae/config.json (AutoencoderKL, ~84 M parameters): what the tiling check decodes with.
FLUX_VAE = {"block_out_channels": (128, 256, 512, 512), "layers_per_block": 2, "norm_num_groups": 32,
            "sample_size": 1024}
# Stand-in VAEs inside the pipelines (8x, the transformer's latent channels): decode is cheap.
STANDIN_VAE = {"block_out_channels": (32, 32, 64, 64), "layers_per_block": 1, "norm_num_groups": 8,
               "sample_size": 1024}
TINY_VAE = {"block_out_channels": (8, 8, 16, 16), "layers_per_block": 1, "norm_num_groups": 8, "sample_size": 64}
GUIDANCE = 3.5
MODEL_NAME = "black-forest-labs/FLUX.1-dev"  # the RuntimeSpec's model name (nothing is loaded from it)
PROMPTS = ["a lighthouse in a storm", "a red fox in the snow", "a castle on a mountain", "an owl at night",
           "a robot in a garden", "a boat on the sea", "a city at night", "a tree in the rain"]
BACKENDS = ["native", "_native_cudnn", "_native_flash", "flash", "sage"]
RATIO_TARGET = 1.03  # issue 17: the runtime's per-step time within 3 % of the plain call
PER_ITEM_TARGET = 1 / 0.95  # issue 39: the runtime at 0.95 of bare pipeline calls, or better

OK, FAIL, NA, SKIPPED = "ok", "FAIL", "n/a", "skipped (dry run)"


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the CPU dry run."""

    mode: str
    device: str
    dtype: str
    transformer: dict[str, Any]
    side: int  # height = width of the big pipeline
    text_tokens: int
    steps: tuple[int, int]  # the two step counts of the differential timing
    repeats: int
    forward_calls: int
    backend_calls: int
    cache_steps: int
    small_transformer: dict[str, Any]
    small_side: int
    small_text_tokens: int
    small_steps: int
    batch_sizes: tuple[int, ...]
    batch_seconds: float  # timed seconds per batch size, at least (and 2 calls; 1 in the dry run)
    vae: dict[str, Any]
    vae_side: int
    standin_vae: dict[str, Any]
    run_dtype: str
    gpus_per_node: int
    budget_s: float
    per_item_count: int  # the per-item check's items
    boxes: dict[str, float] = field(default_factory=dict)

    @property
    def dry(self) -> bool:
        return self.device == "cpu"


GPU = Sizes(
    mode="gpu", device="cuda", dtype="bfloat16", transformer=FLUX_DEV_TRANSFORMER, side=1024, text_tokens=512,
    steps=(4, 12), repeats=3, forward_calls=12, backend_calls=3, cache_steps=28,
    small_transformer=SMALL_FLUX_TRANSFORMER, small_side=512, small_text_tokens=256, small_steps=8,
    batch_sizes=(1, 2, 4, 8), batch_seconds=3.0, vae=FLUX_VAE, vae_side=2048, standin_vae=STANDIN_VAE,
    run_dtype="bfloat16", gpus_per_node=1, budget_s=510, per_item_count=256,
    boxes={"build": 90, "render-path": 120, "attention": 60, "cache": 120, "batching": 90, "vae-tiling": 90,
           "muralist-run": 200, "per-item": 90, "compile": 300},
)
DRY = Sizes(
    mode="dry run", device="cpu", dtype="float32", transformer=TINY_TRANSFORMER, side=64, text_tokens=16,
    steps=(1, 2), repeats=1, forward_calls=2, backend_calls=1, cache_steps=4,
    small_transformer=TINY_TRANSFORMER, small_side=32, small_text_tokens=16, small_steps=1,
    batch_sizes=(1, 2, 4, 8), batch_seconds=0.0, vae=TINY_VAE, vae_side=128, standin_vae=TINY_VAE,
    run_dtype="float32", gpus_per_node=0, budget_s=400, per_item_count=32,
    # ~90 s in all on 2 idle cores (the compile's two halves ~45 s); the boxes only catch hangs, with room for a
    # loaded machine.
    boxes={"build": 60, "render-path": 60, "attention": 30, "cache": 60, "batching": 60, "vae-tiling": 60,
           "muralist-run": 180, "per-item": 90, "compile": 180},
)


@dataclass
class Row:
    path: str
    setting: str
    figure: str
    verdict: str


def log(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr, flush=True)


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(rows: list[Row]) -> str:
    lines = ["| path | setting | figure | verdict |", "|---|---|---|---|"]
    lines += [f"| {cell(r.path)} | {cell(r.setting)} | {cell(r.figure)} | {cell(r.verdict)} |" for r in rows]
    return "\n".join(lines)


# -- time boxes --------------------------------------------------------------------------------


class CheckTimeout(BaseException):
    """A check ran past its time box (raised from SIGALRM in the main thread). Not an Exception:
    the per-setting handlers inside a check must not swallow it."""


@contextlib.contextmanager
def time_box(seconds: float) -> Iterator[None]:
    """Raise CheckTimeout in the main thread after `seconds` (between Python bytecodes: a CUDA
    kernel or a C call in flight finishes first; subprocesses get their own timeouts). An alarm
    already set (pytest-timeout's) is re-armed afterwards with what is left of it."""

    def on_alarm(_signum: int, _frame: Any) -> None:
        raise CheckTimeout(f"ran past its {seconds:.0f} s time box")

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))


# -- the context: device, pipelines, shared figures ----------------------------------------------


class Context:
    def __init__(self, sizes: Sizes, work: Path, out: Path | None):
        import torch

        self.sizes = sizes
        self.work = work
        self.out = out
        self.torch = torch
        self.device = torch.device(sizes.device)
        self.dtype = getattr(torch, sizes.dtype)
        self.deadline = time.monotonic() + sizes.budget_s
        self._big: Any = None
        self._big_error: BaseException | None = None
        self._small: Any = None
        self.runtime_step_s: float | None = None  # render-path's runtime s/step, for compile's "off" row
        self.check_deadline = self.deadline  # the running check's time box ends then
        self.big_params = 0

    # Synchronised wall time: on CUDA kernels run asynchronously.
    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def timed(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        self.sync()
        start = time.perf_counter()
        result = fn()
        self.sync()
        return time.perf_counter() - start, result

    def big(self) -> Any:
        """The FLUX.1-dev-sized pipeline (built once; a failed build fails every check using it)."""
        if self._big_error is not None:
            raise RuntimeError(f"the big pipeline could not be built: {one_line(self._big_error)}")
        if self._big is None:
            try:
                transformer = build_transformer(self, self.sizes.transformer)
                self.big_params = sum(p.numel() for p in transformer.parameters())
                self._big = build_pipeline(self, transformer, self.sizes.text_tokens, self.sizes.standin_vae)
            except Exception as e:
                self._big_error = e
                raise
        return self._big

    def small(self) -> Any:
        if self._small is None:
            self._small = build_pipeline(self, build_transformer(self, self.sizes.small_transformer),
                                         self.sizes.small_text_tokens, self.sizes.standin_vae)
        return self._small

    def drop(self) -> None:
        self._big = self._small = None
        gc.collect()
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()


def build_transformer(ctx: Context, config: dict[str, Any]) -> Any:
    """A FluxTransformer2DModel with random weights, built in its dtype straight on the device."""
    from diffusers import FluxTransformer2DModel

    torch = ctx.torch
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(ctx.dtype)  # no float32 copy of 12 B parameters on the way
    try:
        with torch.device(ctx.device):
            transformer = FluxTransformer2DModel(**config)
    finally:
        torch.set_default_dtype(previous)
    return transformer.eval()


def build_vae(config: dict[str, Any], latent_channels: int) -> Any:
    from diffusers import AutoencoderKL

    levels = len(config["block_out_channels"])
    return AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * levels, up_block_types=("UpDecoderBlock2D",) * levels,
        block_out_channels=tuple(config["block_out_channels"]), layers_per_block=config["layers_per_block"],
        latent_channels=latent_channels, norm_num_groups=config["norm_num_groups"],
        sample_size=config["sample_size"], shift_factor=0.1159, scaling_factor=0.3611,
        use_quant_conv=False, use_post_quant_conv=False)


def build_pipeline(ctx: Context, transformer: Any, text_tokens: int, vae_config: dict[str, Any]) -> Any:
    """A FluxPipeline around `transformer`, with tiny stand-ins of the right widths (no download)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
    from muralist_runtime.model.tiny import MAX_TOKENS, word_level_tokenizer
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch = ctx.torch
    cfg = transformer.config
    tokenizer, vocab = word_level_tokenizer(MAX_TOKENS)
    tokenizer_2, _ = word_level_tokenizer(text_tokens)
    torch.manual_seed(1)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=vocab, hidden_size=cfg.pooled_projection_dim, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=MAX_TOKENS, projection_dim=cfg.pooled_projection_dim,
        pad_token_id=0, bos_token_id=2, eos_token_id=2))
    torch.manual_seed(2)
    text_encoder_2 = T5EncoderModel(T5Config(
        vocab_size=vocab, d_model=cfg.joint_attention_dim, d_kv=64, d_ff=256, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=2, decoder_start_token_id=0))
    torch.manual_seed(3)
    vae = build_vae(vae_config, cfg.in_channels // 4)
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                        tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                        transformer=transformer)
    for module in (text_encoder, text_encoder_2, vae):
        module.eval()  # built, not loaded: T5's dropout would otherwise make every call differ
    pipe.to(ctx.device, ctx.dtype)
    pipe.set_progress_bar_config(disable=True)  # as the runtime's load_pipeline does
    return pipe


def runtime_spec(ctx: Context, steps: int, side: int, text_tokens: int, batch_size: int = 1,
                 name: str = "gpu-check") -> Any:
    """The RuntimeSpec a rank would read for this call (parsed and validated like a manifest)."""
    from muralist_api import RuntimeSpec, parse_job

    job = parse_job({
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": MODEL_NAME, "dtype": ctx.sizes.dtype, "pipeline": "FluxPipeline"},
            "prompts": PROMPTS,
            "generation": {"steps": steps, "guidanceScale": GUIDANCE, "height": side, "width": side, "seed": 0,
                           "batchSize": batch_size, "extraArgs": {"max_sequence_length": text_tokens}},
            "parallelism": {"strategy": "DataParallel", "gpusPerNode": ctx.sizes.gpus_per_node},
        },
    })
    return RuntimeSpec(name=name, spec=job.spec, output_dir=str(ctx.work / name))


def job_items(runtime: Any, count: int) -> list[Any]:
    """The job's first `count` items, made the way a rank makes them (rows, then items)."""
    from muralist_runtime.work import rows

    source = rows.open_rows(runtime)
    return rows.items_of(source.rows(source.start, source.start + count), runtime.spec.generation)


def rank_step_callback(ctx: Context, total: int) -> Callable[[], None]:
    """What a rank passes as on_step: its Progress heartbeat, with a rank file."""
    from muralist_runtime.report.progress import RankProgress
    from muralist_runtime.report.rank_files import RankFile

    prog = RankProgress(0, total, True, local=True, rank_file=RankFile(ctx.work / "progress", 0))
    return prog.step_done


def pil_arrays(images: list[Any]) -> list[Any]:
    """float64 pixels of PIL images (a plain pipeline call) or layouts.RenderedOutput (render_checked)."""
    import numpy as np

    return [None if im is None else np.asarray(im.pixels() if hasattr(im, "pixels") else im, dtype=np.float64)
            for im in images]


def psnr8(a: Any, b: Any) -> float:
    """PSNR (dB) between two 8-bit images as float arrays; inf when identical."""
    import numpy as np

    mse = float(np.mean((a - b) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def fmt_db(value: float) -> str:
    return "identical" if math.isinf(value) else f"{value:.1f} dB"


def params_text(count: int) -> str:
    return f"{count / 1e9:.2f} B parameters" if count >= 1e9 else f"{count / 1e6:.2f} M parameters"


def spread(values: list[float]) -> str:
    return f"median of {len(values)}; {min(values):.4f}-{max(values):.4f}" if len(values) > 1 else "1 sample"


def forward_inputs(ctx: Context, config: dict[str, Any], side: int, text_tokens: int) -> dict[str, Any]:
    """Same-shaped inputs as the pipeline's transformer calls (packed latents, text, ids, guidance)."""
    torch = ctx.torch
    dev, dt = ctx.device, ctx.dtype
    g = torch.Generator(dev).manual_seed(0)
    latent_side = side // 16  # 8x VAE, 2x2 packing
    tokens = latent_side * latent_side
    img_ids = torch.zeros(latent_side, latent_side, 3, device=dev, dtype=dt)
    img_ids[..., 1] = torch.arange(latent_side, device=dev)[:, None]
    img_ids[..., 2] = torch.arange(latent_side, device=dev)[None, :]
    inputs = {
        "hidden_states": torch.randn(1, tokens, config["in_channels"], device=dev, dtype=dt, generator=g),
        "encoder_hidden_states": torch.randn(1, text_tokens, config["joint_attention_dim"], device=dev, dtype=dt,
                                             generator=g),
        "pooled_projections": torch.randn(1, config["pooled_projection_dim"], device=dev, dtype=dt, generator=g),
        "img_ids": img_ids.reshape(tokens, 3),
        "txt_ids": torch.zeros(text_tokens, 3, device=dev, dtype=dt),
        "return_dict": False,
    }
    if config.get("guidance_embeds"):
        inputs["guidance"] = torch.full((1,), GUIDANCE, device=dev, dtype=torch.float32)
    return inputs


def forward_seconds(ctx: Context, transformer: Any, inputs: dict[str, Any], calls: int) -> tuple[list[float], Any]:
    """Seconds of each of `calls` plain forward calls after one warm-up call, and the last output."""
    torch = ctx.torch
    times: list[float] = []
    out = None
    with torch.inference_mode():
        for i in range(calls + 1):
            timestep = torch.full((1,), 1.0 - i / (calls + 1), device=ctx.device, dtype=ctx.dtype)
            seconds, out = ctx.timed(lambda t=timestep: transformer(timestep=t, **inputs)[0])
            if i:  # the first call pays for kernel selection and allocator growth
                times.append(seconds)
    return times, out


# -- the checks ---------------------------------------------------------------------------------

Emit = Callable[[Row], None]


def check_build(ctx: Context, emit: Emit) -> None:
    """The random-weight pipelines, built on the device."""
    s = ctx.sizes
    seconds, _ = ctx.timed(ctx.big)
    memory = ""
    if ctx.device.type == "cuda":
        memory = f", {ctx.torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated"
    tokens = (s.side // 16) ** 2
    emit(Row("build", f"Flux transformer {s.transformer['num_layers']}+{s.transformer['num_single_layers']} blocks "
             f"({'FLUX.1-dev config' if s.transformer is FLUX_DEV_TRANSFORMER else 'toy config'}), {s.dtype} on "
             f"{ctx.device.type}; {s.side}x{s.side} ({tokens} image + {s.text_tokens} text tokens)",
             f"{params_text(ctx.big_params)}, built in {seconds:.1f} s{memory}", OK))
    seconds, small = ctx.timed(ctx.small)
    params = sum(p.numel() for p in small.transformer.parameters())
    emit(Row("build", f"small Flux for batching, {s.dtype}, {s.small_side}x{s.small_side}",
             f"{params_text(params)}, built in {seconds:.1f} s", OK))


def check_render_path(ctx: Context, emit: Emit) -> None:
    """Runtime render_checked vs a plain pipeline call vs a bare forward loop: seconds per step."""
    from muralist_runtime.model import call

    s = ctx.sizes
    pipe = ctx.big()
    a, b = s.steps
    specs = {n: runtime_spec(ctx, n, s.side, s.text_tokens) for n in (a, b)}
    batch = job_items(specs[a], 1)
    on_step = rank_step_callback(ctx, 1)
    item = batch[0]

    def runtime_call(n: int) -> list[Any]:
        return [image for image, _ in call.render_checked(pipe, specs[n], batch, on_step=on_step)]

    def plain_call(n: int) -> list[Any]:
        torch = ctx.torch
        return pipe(prompt=[item.prompt], num_inference_steps=n, guidance_scale=GUIDANCE, height=s.side,
                    width=s.side, generator=[torch.Generator("cpu").manual_seed(item.seed)],
                    max_sequence_length=s.text_tokens).images

    runtime_images = runtime_call(a)  # warm-up: kernels, allocator, tokenizers
    plain_images = plain_call(a)
    forward, _ = forward_seconds(ctx, pipe.transformer, forward_inputs(ctx, s.transformer, s.side, s.text_tokens),
                                 s.forward_calls)
    per = {"runtime": [], "plain": []}
    fixed = {"runtime": [], "plain": []}
    calls = {"runtime": runtime_call, "plain": plain_call}
    for r in range(s.repeats):
        order = ("runtime", "plain") if r % 2 == 0 else ("plain", "runtime")  # ABBA against drift
        for name in order:
            t_a, _ = ctx.timed(lambda n=name: calls[n](a))
            t_b, _ = ctx.timed(lambda n=name: calls[n](b))
            step = (t_b - t_a) / (b - a)
            per[name].append(step)
            fixed[name].append(t_a - a * step)
    run_med, plain_med, fwd_med = (statistics.median(per["runtime"]), statistics.median(per["plain"]),
                                   statistics.median(forward))
    ctx.runtime_step_s = run_med
    emit(Row("render-path", f"plain transformer forward loop ({len(forward)} calls)",
             f"{fwd_med:.4f} s/step ({spread(forward)})", OK))
    emit(Row("render-path", f"plain pipe() call, steps {a} vs {b}, x{s.repeats}",
             f"{plain_med:.4f} s/step ({spread(per['plain'])}); fixed {statistics.median(fixed['plain']):.3f} s/call",
             OK))
    emit(Row("render-path", f"runtime render_checked (RuntimeSpec, rank step callback), steps {a} vs {b}, "
             f"x{s.repeats}",
             f"{run_med:.4f} s/step ({spread(per['runtime'])}); fixed {statistics.median(fixed['runtime']):.3f} "
             "s/call", OK))
    # Same inputs, same images: the runtime's 8-bit conversion is the pipeline's own.
    if runtime_images[0] is None:
        same, same_ok = "runtime output non-finite (render_checked refused it)", False
    else:
        value = psnr8(*pil_arrays([runtime_images[0], plain_images[0]]))
        same, same_ok = f"image vs plain call: {fmt_db(value)}", value > 40  # identical, unless kernels differ
    ratio = run_med / plain_med if plain_med > 0 else math.nan
    figure = (f"{ratio:.3f} (target <= {RATIO_TARGET}); runtime / forward loop "
              f"{run_med / fwd_med if fwd_med > 0 else math.nan:.3f}; {same}")
    if s.dry:
        emit(Row("render-path", "runtime / plain pipe() call", figure + "; timing not judged in the dry run",
                 OK if same_ok else FAIL))
    else:
        emit(Row("render-path", "runtime / plain pipe() call", figure,
                 OK if same_ok and ratio <= RATIO_TARGET else FAIL))


def check_attention(ctx: Context, emit: Emit) -> None:
    """Each attention backend: one step timed on the big transformer, output vs native."""
    from muralist_api.rules.catalog import ATTENTION_BACKENDS

    s = ctx.sizes
    transformer = ctx.big().transformer
    inputs = forward_inputs(ctx, s.transformer, s.side, s.text_tokens)
    reference: Any = None
    native_s: float | None = None
    try:
        for name in BACKENDS:
            try:
                transformer.set_attention_backend(name)
            except (RuntimeError, ValueError, ImportError) as e:  # diffusers' requirement checks
                emit(Row("attention", name, f"not usable here: {one_line(e)}", NA))
                continue
            if s.dry and not ATTENTION_BACKENDS[name].cpu:
                emit(Row("attention", name, "set_attention_backend accepted it; its kernels need CUDA", SKIPPED))
                continue
            try:
                times, out = forward_seconds(ctx, transformer, inputs, s.backend_calls)
            except RuntimeError as e:
                if "no available kernel" in str(e).lower() or "not supported" in str(e).lower():
                    emit(Row("attention", name, f"not on this hardware: {one_line(e)}", NA))
                else:
                    emit(Row("attention", name, one_line(e), FAIL))
                continue
            step = statistics.median(times)
            finite = bool(ctx.torch.isfinite(out).all())
            if reference is None:
                reference, native_s = out.float(), step
                emit(Row("attention", name, f"{step:.4f} s/step ({spread(times)})", OK if finite else FAIL))
                continue
            diff = float((out.float() - reference).abs().max() / reference.abs().max().clamp_min(1e-12))
            emit(Row("attention", name, f"{step:.4f} s/step ({spread(times)}); x{step / native_s:.3f} of native; "
                     f"max |diff| vs native {diff:.2e} (relative)", OK if finite else FAIL))
    finally:
        transformer.set_attention_backend("native")


def cache_config(pipe: Any, cache: str, steps: int) -> tuple[Any, str]:
    """The diffusers config of `cache`, through the spec's option mapping (CACHES), and what was set.

    Every mapped option stays at the config's default except where that default cannot work on
    Flux or does nothing; the setting column says so. Callbacks the runtime would have to supply
    (the pipeline's current timestep; MagCache's ratios and step count) are filled in here.
    """
    import diffusers
    from muralist_api.step_cache import CACHES

    kind = CACHES[cache]
    cls = getattr(diffusers, kind.config)
    names = {f.name for f in dataclasses.fields(cls)}
    missing = [f"{camel} -> {field_name}" for camel, (field_name, _) in kind.options.items() if field_name not in names]
    if missing:
        raise AssertionError(f"CACHES maps options to fields {kind.config} lacks: {', '.join(missing)}")
    options: dict[str, Any] = {}
    notes: list[str] = []
    if cache == "FasterCache" and pipe.transformer.config.get("guidance_embeds"):
        options["isGuidanceDistilled"] = True
        notes.append("guidance-distilled Flux; the default false raises IndexError on Flux")
    if cache == "PyramidAttentionBroadcast":
        options["spatialAttentionBlockSkipRange"] = 2
        notes.append("every skip range defaults to None: nothing would be cached")
    kwargs = {kind.options[camel][0]: value for camel, value in options.items()}
    if "current_timestep_callback" in names:
        kwargs["current_timestep_callback"] = lambda: pipe.current_timestep
    if cache == "MagCache":
        from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

        kwargs.update(mag_ratios=FLUX_MAG_RATIOS, num_inference_steps=steps)
        notes.append("FLUX_MAG_RATIOS")
    shown = ", ".join(f"{k}: {json.dumps(v)}" for k, v in options.items()) or "defaults"
    return cls(**kwargs), shown + (f" ({'; '.join(notes)})" if notes else "")


def check_cache(ctx: Context, emit: Emit) -> None:
    """Each step cache vs uncached: call time ratio and PSNR of the image."""
    from muralist_api.step_cache import CACHES
    from muralist_runtime.model.call import render_checked

    s = ctx.sizes
    pipe = ctx.big()
    spec = runtime_spec(ctx, s.cache_steps, s.side, s.text_tokens)
    batch = job_items(spec, 1)

    def call() -> Any:
        return render_checked(pipe, spec, batch)[0][0]

    base_s, base = ctx.timed(call)
    if base is None:
        raise RuntimeError("the uncached image is non-finite: no reference for PSNR")
    (reference,) = pil_arrays([base])
    emit(Row("cache", f"none ({s.cache_steps} steps)", f"{base_s / s.cache_steps:.4f} s/step (call / steps)", OK))
    for name in CACHES:
        try:
            config, shown = cache_config(pipe, name, s.cache_steps)
            pipe.transformer.enable_cache(config)  # one process: no parallelism to come after it
            try:
                seconds, image = ctx.timed(call)
                again = call()  # a second call must not inherit the first one's cache state
            finally:
                pipe.transformer.disable_cache()
        except Exception as e:
            emit(Row("cache", name, one_line(e), FAIL))
            continue
        if image is None:
            emit(Row("cache", f"{name}: {shown}", "output non-finite", FAIL))
            continue
        value = psnr8(reference, pil_arrays([image])[0])
        repeat = psnr8(*pil_arrays([image, again])) if again is not None else 0.0
        emit(Row("cache", f"{name}: {shown}",
                 f"x{seconds / base_s:.3f} of uncached time ({seconds / s.cache_steps:.4f} s/step); PSNR vs "
                 f"uncached {fmt_db(value)}; 2nd call vs 1st {fmt_db(repeat)}",
                 OK if math.isinf(repeat) or repeat > 40 else FAIL))


def check_batching(ctx: Context, emit: Emit) -> None:
    """Images/s of render_checked on the small Flux at each batch size."""
    from muralist_runtime.model import call

    s = ctx.sizes
    pipe = ctx.small()
    on_step = rank_step_callback(ctx, max(s.batch_sizes))
    rates: dict[int, float] = {}
    for size in s.batch_sizes:
        try:
            spec = runtime_spec(ctx, s.small_steps, s.small_side, s.small_text_tokens, batch_size=size)
            batch = job_items(spec, size)
            call.render_checked(pipe, spec, batch, on_step=on_step)  # warm-up at this shape
            calls, elapsed = 0, 0.0
            while calls < (1 if s.dry else 2) or elapsed < s.batch_seconds:
                seconds, results = ctx.timed(lambda b=batch, sp=spec: call.render_checked(pipe, sp, b,
                                                                                               on_step=on_step))
                calls, elapsed = calls + 1, elapsed + seconds
                bad = sum(image is None for image, _ in results)
                if bad:
                    raise RuntimeError(f"{bad} of {size} outputs non-finite")
        except ctx.torch.OutOfMemoryError as e:
            emit(Row("batching", f"batch {size}", one_line(e), FAIL))
            break
        rates[size] = size * calls / elapsed
        emit(Row("batching", f"batch {size}, {s.small_steps} steps, {s.small_side}x{s.small_side}",
                 f"{rates[size]:.2f} images/s ({calls} calls, {elapsed / calls:.4f} s/call)", OK))
    if 1 in rates:
        best = max(rates, key=lambda k: rates[k])
        emit(Row("batching", "best batch vs batch 1", f"batch {best}: x{rates[best] / rates[1]:.2f} images/s",
                 OK))


def check_vae_tiling(ctx: Context, emit: Emit) -> None:
    """A large decode with and without loading.enable_vae_tiling: peak GPU memory, time, PSNR."""
    from types import SimpleNamespace

    from muralist_runtime.model import loading

    s = ctx.sizes
    torch = ctx.torch
    torch.manual_seed(4)
    vae = build_vae(s.vae, 16).to(ctx.device, ctx.dtype).eval()
    g = torch.Generator(ctx.device).manual_seed(0)
    latents = torch.randn(1, 16, s.vae_side // 8, s.vae_side // 8, device=ctx.device, dtype=ctx.dtype, generator=g)
    cuda = ctx.device.type == "cuda"

    def decode() -> tuple[float, float, Any]:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        with torch.inference_mode():
            seconds, image = ctx.timed(lambda: vae.decode(latents, return_dict=False)[0])
        peak = (torch.cuda.max_memory_allocated() - before) / 2**30 if cuda else math.nan
        return seconds, peak, image.float().clamp(-1, 1)

    whole_s, whole_peak, whole = decode()
    if not loading.enable_vae_tiling(SimpleNamespace(vae=vae)):
        raise RuntimeError("enable_vae_tiling found no tiling VAE")
    tiled_s, tiled_peak, tiled = decode()
    mse = float(((whole - tiled) / 2).pow(2).mean())
    value = math.inf if mse == 0 else 10 * math.log10(1 / mse)
    tile = f"tiles of {vae.tile_sample_min_size} px"
    if cuda:
        emit(Row("vae-tiling", f"decode {s.vae_side}x{s.vae_side}, whole",
                 f"peak {whole_peak:.2f} GiB; {whole_s:.2f} s", OK))
        emit(Row("vae-tiling", f"decode {s.vae_side}x{s.vae_side}, enable_vae_tiling ({tile})",
                 f"peak {tiled_peak:.2f} GiB (x{tiled_peak / whole_peak:.2f} of whole); {tiled_s:.2f} s; PSNR vs "
                 f"whole {fmt_db(value)}", OK if tiled_peak < whole_peak else FAIL))
    else:
        emit(Row("vae-tiling", f"decode {s.vae_side}x{s.vae_side}, whole and enable_vae_tiling ({tile})",
                 f"memory needs CUDA; both decodes ran ({whole_s:.2f} s, {tiled_s:.2f} s), PSNR tiled vs whole "
                 f"{fmt_db(value)}", SKIPPED))


class GpuWatch:
    """Polls nvidia-smi while a `muralist run` goes: the most GPU memory another process held."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.peak_mib = 0
        self.available = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GpuWatch:
        if self.enabled:
            self._thread.start()
        return self

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.5):
            try:
                text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                       "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                      timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                return
            self.available = True
            for line in text.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) != me and parts[1].isdigit():
                    self.peak_mib = max(self.peak_mib, int(parts[1]))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)


def run_manifest(ctx: Context, strategy: str) -> dict[str, Any]:
    s = ctx.sizes
    images = 4
    parallelism: dict[str, Any] = {"strategy": strategy, "nodes": 1, "gpusPerNode": s.gpus_per_node}
    if strategy == "DeviceMap":
        parallelism["deviceMap"] = {"policy": "balanced"}
    return {
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": f"gpu-check-{strategy.lower()}"},
        "spec": {
            "model": {"name": "muralist/tiny-flux", "dtype": s.run_dtype},
            "prompts": PROMPTS[:images],
            "generation": {"steps": 4, "guidanceScale": GUIDANCE, "height": 64, "width": 64, "seed": 0,
                           "extraArgs": {"max_sequence_length": 32}},
            "parallelism": parallelism,
            "output": {"format": "png"},
        },
    }


def muralist_run(ctx: Context, strategy: str, timeout: float) -> Row:
    import yaml

    doc = run_manifest(ctx, strategy)
    expected = len(doc["spec"]["prompts"])
    folder = ctx.work / f"run-{strategy}"
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "job.yaml"
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
    output = folder / "output"
    log_path = (ctx.out or folder) / f"muralist-run-{strategy}.log"
    tree = os.pathsep.join(str(REPO / part) for part in ("cli", "operator", "runtime"))  # this checkout's code
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "MURALIST_TINY_MODELS": str(ctx.work / "models"), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": tree + (os.pathsep + path if path else ""),
           "TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error"}
    if ctx.sizes.dry:
        env["OMP_NUM_THREADS"] = "1"  # 2 shared cores: one thread per process, as torchrun sets
    command = [sys.executable, "-m", "muralist_cli", "run", str(manifest), "--output", str(output)]
    start = time.monotonic()
    with log_path.open("w") as log_file, GpuWatch(ctx.device.type == "cuda") as watch:
        # Its agents run in their own sessions; SIGINT makes `muralist run` stop them cleanly.
        proc = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=folder)
        try:
            code = proc.wait(timeout=timeout)
        except BaseException:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    wall = time.monotonic() - start
    written = sorted((output / "images").glob("*.png")) if (output / "images").is_dir() else []
    job_json = output / "job.json"
    world = json.loads(job_json.read_text()).get("world", {}) if job_json.is_file() else {}
    text = log_path.read_text(errors="replace")
    problems = []
    if code != 0:
        problems.append(f"exit {code}")
    if len(written) != expected:
        problems.append(f"{len(written)} of {expected} images")
    if not world:
        problems.append("no job.json")
    if not ctx.sizes.dry and "running on CPU" in text:
        problems.append("the runtime fell back to the CPU")
    figure = (f"exit {code}; {len(written)}/{expected} PNGs, job.json world {world.get('worldSize', '?')} rank(s) x "
              f"{world.get('processesPerNode', '?')}/node; {wall:.1f} s")
    if ctx.device.type == "cuda":
        figure += (f"; a worker held {watch.peak_mib} MiB of GPU memory (nvidia-smi)" if watch.available
                   else "; nvidia-smi not available")
        if world.get("worldSize") == 1:
            figure += "; world of 1: no process group, so no NCCL (one GPU cannot hold 2 NCCL ranks)"
    if problems:
        tail = " / ".join(line for line in text.strip().splitlines()[-3:])
        figure += f"; {', '.join(problems)}; log: {tail[-300:]}"
    setting = (f"muralist/tiny-flux, {expected} images, gpusPerNode {ctx.sizes.gpus_per_node}, {ctx.sizes.run_dtype}"
               + (", deviceMap balanced" if strategy == "DeviceMap" else ""))
    return Row("muralist-run", f"{strategy}: {setting}", figure, OK if not problems else FAIL)


def check_muralist_run(ctx: Context, emit: Emit) -> None:
    """`muralist run` of a DataParallel and a DeviceMap job: the real launcher, torchrun, runtime."""
    for strategy in ("DataParallel", "DeviceMap"):
        left = ctx.check_deadline - time.monotonic() - 5
        try:
            emit(muralist_run(ctx, strategy, timeout=max(left / (2 if strategy == "DataParallel" else 1), 5)))
        except subprocess.TimeoutExpired as e:
            emit(Row("muralist-run", strategy, f"timed out after {e.timeout:.0f} s", FAIL))


def check_per_item(ctx: Context, emit: Emit) -> None:
    """The runtime's per-item path against bare pipeline calls: `muralist run` of many small items (tiny-flux, one
    process, PNGs written) timed by its generateSeconds, against the same items called one by one in this process
    on the same pipeline with no output; per item, the difference is what the runtime adds (claims, records,
    writing on its threads, progress)."""
    import yaml
    from muralist_runtime.model.tiny import build_tiny

    s = ctx.sizes
    torch = ctx.torch
    count, steps, side, tokens = s.per_item_count, 4, 64, 32
    models = ctx.work / "models"
    model = build_tiny("muralist/tiny-flux", models / "muralist--tiny-flux")
    folder = ctx.work / "per-item"
    folder.mkdir(parents=True, exist_ok=True)
    doc = run_manifest(ctx, "DataParallel")
    doc["metadata"]["name"] = "gpu-check-per-item"
    doc["spec"]["prompts"] = [PROMPTS[i % len(PROMPTS)] + f" {i}" for i in range(count)]
    doc["spec"]["generation"].update(steps=steps, height=side, width=side, extraArgs={"max_sequence_length": tokens})
    manifest = folder / "job.yaml"
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
    output = folder / "output"
    env = {**os.environ, "MURALIST_TINY_MODELS": str(models), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([*(str(REPO / p) for p in ("cli", "operator", "runtime")),
                                          os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error"}
    if s.dry:
        env["OMP_NUM_THREADS"] = "1"
    left = max(ctx.check_deadline - time.monotonic() - 30, 10)
    with (ctx.out or folder).joinpath("muralist-run-per-item.log").open("w") as log_file:
        code = subprocess.run([sys.executable, "-m", "muralist_cli", "run", str(manifest), "--output", str(output)],
                              env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=folder, timeout=left).returncode
    record = json.loads((output / "job.json").read_text()) if (output / "job.json").is_file() else {}
    if code != 0 or not record.get("generateSeconds"):
        raise RuntimeError(f"muralist run exited {code} (log: muralist-run-per-item.log)")
    runtime_s = record["generateSeconds"] / count

    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(model), dtype=getattr(torch, s.run_dtype)).to(ctx.device)
    pipe.set_progress_bar_config(disable=True)
    threads = torch.get_num_threads()
    if s.dry:
        torch.set_num_threads(1)  # as each rank of the run had
    try:
        def bare(i: int) -> Any:
            return pipe(doc["spec"]["prompts"][i], num_inference_steps=steps, guidance_scale=GUIDANCE, height=side,
                        width=side, max_sequence_length=tokens,
                        generator=torch.Generator("cpu").manual_seed(i)).images[0]

        bare(0)  # warm-up, as the run's first item pays its own
        bare_s, _ = ctx.timed(lambda: [bare(i) for i in range(count)])
    finally:
        torch.set_num_threads(threads)
    bare_s /= count
    ratio = runtime_s / bare_s
    emit(Row("per-item", f"muralist/tiny-flux, {count} items of {side}x{side}, {steps} steps, 1 process, PNGs: "
             "`muralist run` generateSeconds vs bare pipe() calls",
             f"runtime {runtime_s * 1000:.1f} ms/item, bare {bare_s * 1000:.1f} ms/item: x{ratio:.3f} "
             f"({(runtime_s - bare_s) * 1000:+.1f} ms/item)" + ("; timing not judged in the dry run" if s.dry else
                                                                f" (target <= {PER_ITEM_TARGET})"),
             OK if s.dry or ratio <= PER_ITEM_TARGET else FAIL))


def check_compile(ctx: Context, emit: Emit) -> None:
    """generation.compile through the runtime's own code (model/compiling.py) on the big transformer: cold (an
    empty compile cache and inductor folder), then as a new pod starts (dynamo reset, inductor's in-memory caches
    cleared, another empty inductor folder) from the entry the cold compile wrote: compile + warm-up time, graphs
    compiled and kernels built each time; then step time compiled vs not."""
    from muralist_runtime.model import call, compile_cache, compiling

    s = ctx.sizes
    torch = ctx.torch
    pipe = ctx.big()
    a, b = s.steps
    specs = {n: runtime_spec(ctx, n, s.side, s.text_tokens) for n in (a, b)}
    batch = job_items(specs[a], 1)
    on_step = rank_step_callback(ctx, 1)  # like for like with render-path's runtime figure

    def per_step(repeats: int) -> list[float]:
        out = []
        for _ in range(repeats):
            t_a, _ = ctx.timed(lambda: call.render_checked(pipe, specs[a], batch, on_step=on_step))
            t_b, _ = ctx.timed(lambda: call.render_checked(pipe, specs[b], batch, on_step=on_step))
            out.append((t_b - t_a) / (b - a))
        return out

    off = ctx.runtime_step_s
    if off is None:  # render-path did not run or failed: measure the uncompiled step here
        call.render_checked(pipe, specs[a], batch)
        off = statistics.median(per_step(1))
    emit(Row("compile", "off", f"{off:.4f} s/step (runtime render_checked)", OK))
    cache = ctx.work / "compile-cache"
    for cold in (True, False):
        torch._dynamo.reset()
        compiled = compiling.CompiledTransformer(pipe, specs[a], MODEL_NAME, None, not s.dry, False,
                                                  compile_cache.Location(str(cache)))
        compiled.apply()  # in an inductor folder of its own, inductor's in-memory caches cleared
        seconds, _ = ctx.timed(lambda c=compiled: c.warm_up(batch[0]))
        compiled.close()  # its inductor folder: the functions and their kernels are loaded
        size = next(iter(compiled.record.sizes.values()))
        entries = sorted(cache.glob("*.tar"))
        entry = f"; entry {entries[0].stat().st_size / 2**20:.1f} MiB" if entries else "; no entry written"
        figure = (f"compile + warm-up {seconds:.1f} s; cache hit {size.cache_hit}; {size.graphs_compiled} graphs "
                  f"compiled, {size.kernels_built} kernels built{entry}")
        right = (not size.cache_hit and size.graphs_compiled > 0) if cold else (
            size.cache_hit and size.graphs_compiled == size.kernels_built == 0)
        label = "cold: an empty compile cache" if cold else "a new pod: from the compile cache"
        emit(Row("compile", f"{label}; {compiled.record.scope} (compiling.scope), fullgraph", figure,
                 OK if right else FAIL))
    on = per_step(2)
    emit(Row("compile", "on: step time", f"{statistics.median(on):.4f} s/step ({spread(on)}); "
             f"x{off / statistics.median(on):.3f} faster than off"
             + ("; timing not judged in the dry run" if s.dry else ""), OK))


@dataclass
class Check:
    name: str
    fn: Callable[[Context, Emit], None]


CHECKS = [
    Check("build", check_build),
    Check("render-path", check_render_path),
    Check("attention", check_attention),
    Check("cache", check_cache),
    Check("batching", check_batching),
    Check("vae-tiling", check_vae_tiling),
    Check("muralist-run", check_muralist_run),
    Check("per-item", check_per_item),
    Check("compile", check_compile),  # last: compiling changes the big transformer for good
]


def run_checks(ctx: Context, record: Callable[[Row], None]) -> list[Row]:
    rows: list[Row] = []

    def emit(row: Row) -> None:
        rows.append(row)
        record(row)
        log(f"{row.path} | {row.setting} | {row.figure} | {row.verdict}")

    for check in CHECKS:
        left = ctx.deadline - time.monotonic()
        box = min(ctx.sizes.boxes.get(check.name, 60), left)
        if box < 5:
            emit(Row(check.name, "-", f"not run: the run's {ctx.sizes.budget_s:.0f} s budget was spent", FAIL))
            continue
        ctx.check_deadline = time.monotonic() + box
        log(f"{check.name}: starting (time box {box:.0f} s)")
        start = time.monotonic()
        try:
            with time_box(box):
                check.fn(ctx, emit)
        except CheckTimeout as e:
            emit(Row(check.name, "-", f"stopped: {e}", FAIL))
        except Exception as e:
            emit(Row(check.name, "-", one_line(e), FAIL))
        finally:
            if ctx.device.type == "cuda":
                with contextlib.suppress(Exception):
                    ctx.torch.cuda.synchronize()
        log(f"{check.name}: {time.monotonic() - start:.1f} s")
    return rows


def caption(sizes: Sizes, wall: float | None) -> str:
    import torch

    if sizes.dry:
        where = f"CPU dry run ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs)"
    else:
        where = torch.cuda.get_device_name()
    versions = f"torch {torch.__version__}"
    with contextlib.suppress(Exception):
        import diffusers

        versions += f", diffusers {diffusers.__version__}"
    took = f", {wall:.0f} s" if wall is not None else ""
    return f"GPU check: {where}; {versions}; {time.strftime('%Y-%m-%d')}{took}"


def refuse_without_cuda() -> int | None:
    try:
        import torch
    except ImportError:
        print("gpu_check.py: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("gpu_check.py: no CUDA device is visible (torch.cuda.is_available() is False); this check needs one "
              "NVIDIA GPU with ~60 GB of memory, or --dry-run for the CPU dry run", file=sys.stderr)
        return 2
    return None


def print_rows_file(path: Path, killed_after: float | None) -> int:
    rows = [Row(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if killed_after is not None:
        rows.append(Row("gpu-check", "-", f"killed after {killed_after:.0f} s (the script's hard limit); the rows "
                        "above are what finished", FAIL))
    print(table(rows))
    return 1 if any(r.verdict == FAIL for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, toy sizes: the code paths, no GPU figures")
    parser.add_argument("--out", type=Path, help="write gpu-check.md, gpu-check.jsonl and the run logs here")
    parser.add_argument("--budget", type=float, help="seconds for all checks (default 510 on GPU, 400 dry)")
    parser.add_argument("--table", type=Path, metavar="ROWS.jsonl", help="only print the table of a rows file")
    parser.add_argument("--killed-after", type=float, help="with --table: add a row saying the run was killed")
    args = parser.parse_args(argv)
    if args.table:
        return print_rows_file(args.table, args.killed_after)
    sizes = DRY if args.dry_run else GPU
    if not sizes.dry:
        refused = refuse_without_cuda()
        if refused is not None:
            return refused
    if args.budget:
        sizes = dataclasses.replace(sizes, budget_s=args.budget)
    # A TERM (the shell's timeout) ends the run through the finally blocks: no orphaned agents.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    started = time.monotonic()
    import torch

    if sizes.dry:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    out = args.out.resolve() if args.out else None
    rows_file = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        rows_file = (out / "gpu-check.jsonl").open("w")

    def record(row: Row) -> None:
        if rows_file is not None:
            rows_file.write(json.dumps(dataclasses.asdict(row)) + "\n")
            rows_file.flush()

    with tempfile.TemporaryDirectory(prefix="muralist-gpu-check-") as work:
        ctx = Context(sizes, Path(work), out)
        try:
            rows = run_checks(ctx, record)
        finally:
            ctx.drop()
            if rows_file is not None:
                rows_file.close()
    text = caption(sizes, time.monotonic() - started) + "\n\n" + table(rows)
    if out is not None:
        (out / "gpu-check.md").write_text(text + "\n")
    print(text, flush=True)
    failed = [r for r in rows if r.verdict == FAIL]
    log(f"{len(rows)} rows, {len(failed)} FAIL, {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
