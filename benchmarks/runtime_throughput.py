#!/usr/bin/env python3
"""Runtime throughput on CPU: `muralist run` DataParallel vs diffusers' reference recipe.

    ~/.cache/muralist/venv/bin/python benchmarks/runtime_throughput.py [--rounds 3] [--prompts 16]
        [--batch-sizes 1 2 4] [--git-rev HEAD] [--quick]   # --git-rev: that commit's runtime, not the tree's

One small but compute-bound Flux pipeline (random weights, a ~36 M-parameter transformer,
a VAE that downsamples 8x; built once into a cache directory), the same prompts and seeds,
2 processes x 1 thread each, in one run:

- reference: `accelerate launch --multi_gpu --num_processes 2 reference_accelerate.py`
  (PartialState.split_between_processes, one pipeline call per prompt);
- muralist bs=N: `muralist run JOB.yaml --model DIR --output DIR` with DataParallel,
  processesPerNode 2, batchSize N.

Rounds interleave the variants (a, b1, b2, b4, a, b1, ...) so drift in the machine's load
hits all of them alike. Both sides are timed by the same records:

- generation img/s: images / generation span, the span running from the start of the first
  pipeline call of any rank to the last image file written (its modification time). The call
  times come from call_times/sitecustomize.py, which both launchers load (PYTHONPATH): it
  wraps FluxPipeline.__call__ and appends each call's start and end to a file per process.
  The span includes writing the PNGs (both sides write them) and what a side does between
  calls (the runtime: claims, sidecars, manifest, progress), not loading or start-up.
- end-to-end img/s: images / wall time of the launcher command (imports, process start,
  rendezvous, model load, generation, runtime summary/gallery).
- CPU s/image: user + system CPU of the launcher and all its processes, per image.

--quick: 4 images of 64x64, 1 round, the reference and bs=1 only (about half a minute; the
test suite runs it to check that the table prints).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
DEFAULT_CACHE = Path(os.environ.get("MURALIST_CACHE", Path.home() / ".cache/muralist")) / "bench"
MODEL_NAME = "flux-36m-v1"  # bump when the architecture below changes

# The tiny pipeline (runtime/muralist_runtime/model/tiny.py) scaled up: inner width 8 x 64 = 512,
# 2 double + 4 single blocks ~ 36 M parameters; head dim 64 = sum(axes_dims_rope).
TRANSFORMER_CONFIG = {
    "patch_size": 1,
    "in_channels": 64,  # 16 latent channels, packed 2x2
    "num_layers": 2,
    "num_single_layers": 4,
    "attention_head_dim": 64,
    "num_attention_heads": 8,
    "joint_attention_dim": 256,
    "pooled_projection_dim": 64,
    "axes_dims_rope": [16, 24, 24],
}
HEIGHT = WIDTH = 256  # 8x VAE, 2x2 packing: 16 x 16 = 256 image tokens (--size)
CALL_TIMES = HERE / "call_times"  # sitecustomize.py: times every FluxPipeline call
STEPS = 4
GUIDANCE = 3.5
MAX_SEQUENCE_LENGTH = 256  # T5 text tokens (FLUX.1-schnell's default)
WORDS = ("red fox", "lighthouse", "castle", "owl", "robot", "boat", "city", "garden",
         "mountain", "river", "tower", "bridge", "forest", "train", "horse", "flower")


def prompts(n: int) -> list[str]:
    return [f"a {WORDS[i % len(WORDS)]} in the {('night', 'snow', 'rain', 'sun')[i % 4]}"
            for i in range(n)]


def build_model(directory: Path) -> Path:
    """Build the benchmark pipeline once (deterministic random weights); reuse it after."""
    if (directory / "model_index.json").exists():
        return directory
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from muralist_runtime.model.tiny import MAX_TOKENS, word_level_tokenizer  # offline WordLevel tokenizers
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    tokenizer, vocab = word_level_tokenizer(MAX_TOKENS)
    tokenizer_2, _ = word_level_tokenizer(MAX_SEQUENCE_LENGTH)
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(**TRANSFORMER_CONFIG)
    torch.manual_seed(1)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=MAX_TOKENS, projection_dim=64,
        pad_token_id=0, bos_token_id=2, eos_token_id=2))
    torch.manual_seed(2)
    text_encoder_2 = T5EncoderModel(T5Config(
        vocab_size=vocab, d_model=TRANSFORMER_CONFIG["joint_attention_dim"], d_kv=32, d_ff=512,
        num_layers=1, num_heads=4, relative_attention_num_buckets=8, pad_token_id=0,
        eos_token_id=2, decoder_start_token_id=0))
    torch.manual_seed(3)
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
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    pipe.save_pretrained(staging)
    staging.replace(directory)
    params = sum(p.numel() for p in transformer.parameters())
    print(f"built {directory} (transformer {params / 1e6:.1f} M parameters)", flush=True)
    return directory


# --------------------------------------------------------------------------- variants


@dataclass
class Result:
    images: int
    generation_s: float
    end_to_end_s: float
    cpu_s: float  # user + system CPU seconds of the launcher and all its processes


@dataclass
class Variant:
    name: str
    slug: str  # output directory name
    batch_size: int | None  # None: the reference
    results: list[Result] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(r.images / getattr(r, attr) for r in self.results)


def job_manifest(model: Path, texts: list[str], batch_size: int, size: int, tokens: int) -> dict[str, object]:
    return {
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": f"bench-bs{batch_size}"},
        "spec": {
            "model": {"name": str(model), "dtype": "float32", "pipeline": "FluxPipeline"},
            "prompts": texts,
            "generation": {"steps": STEPS, "guidanceScale": GUIDANCE, "height": size,
                           "width": size, "seed": 0, "batchSize": batch_size,
                           "extraArgs": {"max_sequence_length": tokens}},
            "parallelism": {"strategy": "DataParallel", "nodes": 1, "gpusPerNode": 0,
                            "processesPerNode": 2},
            "output": {"format": "png"},
        },
    }


# Set by --git-rev: the project's source trees of that revision, ahead of the editable install.
PYTHONPATH_PREFIX: list[str] = []


def export_revision(rev: str, work: Path) -> str:
    """`git archive REV` into `work`; its packages then shadow the checkout's (PYTHONPATH
    entries come before the editable install's finder), in this process's children only."""
    repo = HERE.parent
    target = work / "src"
    target.mkdir()
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", rev], check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "runtime", "cli", "operator"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    PYTHONPATH_PREFIX[:] = [str(target / d) for d in ("api", "runtime", "cli", "operator")]
    return commit


def bench_env(call_log: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(CALL_TIMES), *PYTHONPATH_PREFIX,
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MURALIST_BENCH_CALL_LOG"] = str(call_log)
    # torchrun sets OMP_NUM_THREADS=1 per worker when it starts several; say it for both
    # launchers so the thread count is the same by construction.
    return {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error"}


def run_reference(model: Path, prompts_file: Path, out: Path, size: int, tokens: int,
                  calls: Path) -> tuple[float, float]:
    from muralist_runtime.local import free_port_range  # below the ephemeral range: nothing takes it meanwhile

    cmd = [str(VENV_BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port_range(1)), str(HERE / "reference_accelerate.py"),
           "--model", str(model), "--prompts", str(prompts_file), "--output", str(out),
           "--steps", str(STEPS), "--height", str(size), "--width", str(size),
           "--guidance-scale", str(GUIDANCE), "--max-sequence-length", str(tokens)]
    return timed(cmd, calls)


def run_muralist(model: Path, texts: list[str], batch_size: int, work: Path, out: Path, size: int, tokens: int,
                 calls: Path) -> tuple[float, float]:
    manifest = work / f"job-bs{batch_size}.yaml"
    manifest.write_text(yaml.safe_dump(job_manifest(model, texts, batch_size, size, tokens), sort_keys=False))
    cmd = [str(VENV_BIN / "muralist"), "run", str(manifest), "--model", str(model),
           "--output", str(out)]
    return timed(cmd, calls)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], calls: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and every process it waited for); its
    processes' pipeline calls logged into `calls`."""
    calls.mkdir(parents=True)
    cpu, start = children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=bench_env(calls), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    elapsed, cpu = time.perf_counter() - start, children_cpu() - cpu
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout.decode(errors="replace")[-4000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return elapsed, cpu


def generation_seconds(calls: Path, images: list[Path], expected: int) -> float:
    """Start of the first pipeline call of any process -> the last image file written: the
    same records for both sides (their calls timed by call_times/sitecustomize.py)."""
    records = [json.loads(line) for f in calls.glob("calls-*.jsonl") for line in f.read_text().splitlines()]
    rendered = sum(r["images"] for r in records)
    if rendered != expected:  # a call the hook missed, or one more than the images (a warm-up)
        raise SystemExit(f"{calls}: pipeline calls logged {rendered} images, expected {expected}")
    return max(p.stat().st_mtime for p in images) - min(r["start"] for r in records)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--keep", action="store_true", help="keep the output images")
    parser.add_argument("--size", type=int, default=HEIGHT, help="image height and width")
    parser.add_argument("--quick", action="store_true",
                        help="muralist/tiny-flux, 4 images of 32x32, 1 round, the reference and bs=1 (checks that "
                        "it runs)")
    parser.add_argument("--git-rev", default=None,
                        help="benchmark the runtime of this git revision (e.g. HEAD) instead of "
                             "the working tree as it is")
    args = parser.parse_args()
    tokens = MAX_SEQUENCE_LENGTH
    if args.quick:
        args.rounds, args.prompts, args.batch_sizes, args.size = 1, 4, [1], 32
        from muralist_runtime.model.resolve import tiny_cache_dir
        from muralist_runtime.model.tiny import build_tiny

        model = build_tiny("muralist/tiny-flux", tiny_cache_dir("muralist/tiny-flux"))
        tokens = 16  # as the runtime's tests render it
    else:
        args.cache.mkdir(parents=True, exist_ok=True)
        model = build_model(args.cache / MODEL_NAME)
    texts = prompts(args.prompts)
    variants = [Variant("reference (accelerate)", "reference", None)] + [
        Variant(f"muralist bs={bs}", f"bs{bs}", bs) for bs in args.batch_sizes]
    work = Path(tempfile.mkdtemp(prefix="muralist-bench-"))
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(texts))
    loads = [load_average()]
    try:
        source = "working tree"
        if args.git_rev:
            source = f"git {export_revision(args.git_rev, work)}"
        print(f"{model.name}: {args.prompts} images of {args.size}x{args.size}, {STEPS} steps, 2 processes x 1 thread; "
              f"runtime from the {source}; load average {loads[0]}", flush=True)
        for rnd in range(args.rounds):
            for v in variants:
                out, calls = work / f"r{rnd}-{v.slug}", work / f"r{rnd}-{v.slug}-calls"
                if v.batch_size is None:
                    wall, cpu = run_reference(model, prompts_file, out, args.size, tokens, calls)
                    pngs = sorted(out.glob("*.png"))
                else:
                    wall, cpu = run_muralist(model, texts, v.batch_size, work, out, args.size, tokens, calls)
                    pngs = sorted((out / "images").glob("*.png"))
                if len(pngs) != args.prompts:
                    raise SystemExit(f"{v.name}: {len(pngs)} images, expected {args.prompts}")
                v.results.append(Result(len(pngs), generation_seconds(calls, pngs, args.prompts), wall, cpu))
                r = v.results[-1]
                print(f"round {rnd + 1} {v.name:24s} generation {r.generation_s:6.2f}s "
                      f"({r.images / r.generation_s:.3f} img/s)  end-to-end {r.end_to_end_s:6.2f}s "
                      f"({r.images / r.end_to_end_s:.3f} img/s)  CPU {r.cpu_s / r.images:.2f}s/img  "
                      f"load {load_average()}", flush=True)
            loads.append(load_average())
        identical = same_images(work / "r0-reference", work / "r0-bs1")
        report(variants, loads, identical, args, model)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"outputs kept in {work}")
    return 0


def same_images(reference: Path, muralist: Path) -> str:
    """Do the reference and muralist bs=1 render the same pixels (same seeds, same model)?"""
    import numpy as np
    from PIL import Image

    pairs = [(p, muralist / "images" / p.name) for p in sorted(reference.glob("*.png"))]
    if not pairs or not all(m.exists() for _, m in pairs):
        return "not compared"
    diffs = [np.abs(np.asarray(Image.open(a), dtype=np.int16) - np.asarray(Image.open(b), dtype=np.int16)).max()
             for a, b in pairs]
    return "identical" if max(diffs) == 0 else f"max pixel difference {max(diffs)}"


def report(variants: list[Variant], loads: list[str], identical: str, args: argparse.Namespace, model: Path) -> None:
    ref = variants[0]
    ref_gen, ref_e2e = ref.median("generation_s"), ref.median("end_to_end_s")
    print(f"\n{model.name}: {args.prompts} images of {args.size}x{args.size}, {STEPS} steps, 2 processes x 1 thread; "
          f"median of {len(ref.results)} round(s); load average before/after each round: {' | '.join(loads)}")
    print(f"reference vs muralist bs=1 images: {identical}\n")
    print("| variant | generation img/s | ratio vs reference | end-to-end img/s | ratio vs reference "
          "| CPU s/image (end-to-end) |")
    print("|---|---:|---:|---:|---:|---:|")
    for v in variants:
        gen, e2e = v.median("generation_s"), v.median("end_to_end_s")
        cpu = statistics.median(r.cpu_s / r.images for r in v.results)
        print(f"| {v.name} | {gen:.3f} | {gen / ref_gen:.2f} | {e2e:.3f} | {e2e / ref_e2e:.2f} "
              f"| {cpu:.2f} |")


if __name__ == "__main__":
    raise SystemExit(main())
