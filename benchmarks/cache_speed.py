#!/usr/bin/env python3
"""Step caches on CPU: images/s of each generation.cache setting against no cache, and what it
costs in quality (PSNR against the uncached images), on the compute-bound benchmark pipeline.

    ~/.cache/muralist/venv/bin/python benchmarks/cache_speed.py [--rounds 3] [--prompts 2]
        [--steps 28] [--threads 1] [--only none FBCache-0.2 ...]

The pipeline is runtime_throughput.py's (a Flux pipeline with a 36 M-parameter random-weight
transformer, 256 x 256, 256 text tokens; built once into ~/.cache/muralist/bench). Everything
runs in this one process through the runtime's own code: options.enable_cache (the
generation.cache of a job) and pipeline.render_checked (the call every rank makes), with the
same prompts and seeds for every setting. Rounds interleave the settings (none, A, B, ...,
none, then again) so that drift in the machine's load hits them alike; each round's ratio is
against the mean of that round's two uncached runs (its first and last), and the table gives
the median over rounds with the load averages.
Two speed ratios: wall time (images/s), and this process's CPU time (with one thread, the
work done: much less sensitive to what else runs on a shared machine, where wall-time ratios
of a setting that skips nothing ranged 0.87-1.18 in one run).

Besides speed and PSNR, two diagnostics say why a cache does what it does:
- "attn / MLP runs": how often the last single block's attention (attn.to_q) and MLP
  (proj_mlp) really ran, per denoising step (100 % = never skipped);
- "residual change" (uncached runs only): the mean relative L1 change, from one step to the
  next, of the first double block's residual (output - input), which is what FirstBlockCache
  compares with its threshold, and of the transformer's output (the velocity the sampler
  integrates), which is what reusing a step costs. Caches pay off when both are small for many
  steps in a row.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from runtime_throughput import (  # noqa: E402  (the benchmark pipeline, shared)
    DEFAULT_CACHE,
    GUIDANCE,
    HEIGHT,
    MAX_SEQUENCE_LENGTH,
    MODEL_NAME,
    WIDTH,
    build_model,
    load_average,
    prompts,
)

# (label, cache type, options): diffusers' defaults first, then more aggressive settings.
SETTINGS: list[tuple[str, str | None, dict[str, Any]]] = [
    ("none", None, {}),
    ("FirstBlockCache 0.05", "FirstBlockCache", {"threshold": 0.05}),
    ("FirstBlockCache 0.2", "FirstBlockCache", {"threshold": 0.2}),
    ("FirstBlockCache 0.4", "FirstBlockCache", {"threshold": 0.4}),
    ("FirstBlockCache 0.6", "FirstBlockCache", {"threshold": 0.6}),  # above this model's residual change
    ("TaylorSeer interval 5 (default)", "TaylorSeer", {}),
    ("TaylorSeer interval 3", "TaylorSeer", {"cacheInterval": 3}),
    ("TaylorSeer interval 2, order 2", "TaylorSeer", {"cacheInterval": 2, "maxOrder": 2}),
    ("MagCache 0.06 (default)", "MagCache", {}),
    ("MagCache 0.24, 5 skips", "MagCache", {"threshold": 0.24, "maxSkipSteps": 5}),
    ("FasterCache (default)", "FasterCache", {}),
    ("PyramidAttentionBroadcast 2", "PyramidAttentionBroadcast", {"spatialAttentionBlockSkipRange": 2}),
    ("PyramidAttentionBroadcast 3", "PyramidAttentionBroadcast", {"spatialAttentionBlockSkipRange": 3}),
]


@dataclass
class Setting:
    label: str
    kind: str | None
    options: dict[str, Any]
    seconds: list[float] = field(default_factory=list)  # per round, for all prompts (wall time)
    ratios: list[float] = field(default_factory=list)  # per round, images/s vs that round's uncached
    cpu_seconds: list[float] = field(default_factory=list)  # per round: this process's CPU time
    cpu_ratios: list[float] = field(default_factory=list)
    psnr: list[float] = field(default_factory=list)  # per image and round
    attn_runs: list[float] = field(default_factory=list)
    mlp_runs: list[float] = field(default_factory=list)


def runtime_spec(model: Path, texts: list[str], steps: int, kind: str | None, options: dict[str, Any]) -> Any:
    from muralist_api.runtime_spec import RuntimeSpec

    generation: dict[str, Any] = {"steps": steps, "guidanceScale": GUIDANCE, "height": HEIGHT, "width": WIDTH,
                                  "extraArgs": {"max_sequence_length": MAX_SEQUENCE_LENGTH}}
    if kind:
        generation["cache"] = {"type": kind, "options": options}
    return RuntimeSpec.model_validate({
        "name": "cache-bench", "outputDir": "/unused",
        "spec": {"model": {"name": str(model), "dtype": "float32", "pipeline": "FluxPipeline"}, "prompts": texts,
                 "generation": generation, "parallelism": {"gpusPerNode": 0}},
    })


class Counters:
    """Calls of the last single block's attention and MLP, and the first block's residual change."""

    def __init__(self, transformer: Any):
        last = transformer.single_transformer_blocks[-1]
        self.attn = self.mlp = 0
        self.changes: list[float] = []
        self.output_changes: list[float] = []
        self._previous: Any = None
        self._previous_output: Any = None
        self._handles = [
            transformer.register_forward_hook(self._output),
            last.attn.to_q.register_forward_hook(lambda *_: self._count("attn")),
            last.proj_mlp.register_forward_hook(lambda *_: self._count("mlp")),
            transformer.transformer_blocks[0].register_forward_hook(self._residual, with_kwargs=True),
        ]

    def _count(self, what: str) -> None:
        setattr(self, what, getattr(self, what) + 1)

    def _residual(self, _module: Any, args: Any, kwargs: Any, output: Any) -> None:
        # FirstBlockCache's measure: mean |r_t - r_t-1| / mean |r_t-1| of the block's residual
        # r = output - input of the image stream (Flux blocks return (text, image)).
        given = kwargs.get("hidden_states", args[0] if args else None)
        hidden = output[-1] if isinstance(output, tuple) else output
        residual = (hidden - given).detach()
        if self._previous is not None and self._previous.shape == residual.shape:
            self.changes.append(float((residual - self._previous).abs().mean() / self._previous.abs().mean()))
        self._previous = residual.clone()

    def _output(self, _module: Any, _inputs: Any, output: Any) -> None:
        velocity = (output[0] if isinstance(output, tuple) else output.sample).detach()
        if self._previous_output is not None and self._previous_output.shape == velocity.shape:
            self.output_changes.append(float((velocity - self._previous_output).abs().mean()
                                             / self._previous_output.abs().mean()))
        self._previous_output = velocity.clone()

    def new_image(self) -> None:
        self._previous = self._previous_output = None

    def reset(self) -> None:
        self.attn = self.mlp = 0
        self.changes, self.output_changes = [], []
        self._previous = self._previous_output = None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def psnr(a: Any, b: Any) -> float:
    import numpy as np

    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def render_all(pipe: Any, runtime: Any, counters: Counters) -> tuple[float, float, list[Any]]:
    """(wall seconds, CPU seconds of this process, the images' pixels) for the job's items."""
    from muralist_runtime.model import pipeline
    from muralist_runtime.work import rows

    source = rows.open_rows(runtime)
    items = rows.items_of(source.rows(0, source.count()), runtime.spec.generation)
    start, cpu = time.perf_counter(), time.process_time()
    out = []
    for item in items:  # one image per call, as a batchSize 1 job
        counters.new_image()
        output, reason = pipeline.render_checked(pipe, runtime, [item])[0]
        assert reason is None, reason
        out.append(output.pixels())
    return time.perf_counter() - start, time.process_time() - cpu, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--steps", type=int, default=28,
                        help="28: FLUX.1-dev's default, the steps MagCache's ratios were calibrated at")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--only", nargs="+", default=None, help="labels of SETTINGS to run (none is always run)")
    args = parser.parse_args()

    import torch
    from muralist_runtime.model import options, pipeline

    torch.set_num_threads(args.threads)
    args.cache.mkdir(parents=True, exist_ok=True)
    model = build_model(args.cache / MODEL_NAME)
    texts = prompts(args.prompts)
    settings = [Setting(label, kind, options) for label, kind, options in SETTINGS
                if kind is None or args.only is None or label in args.only]
    base_runtime = runtime_spec(model, texts, args.steps, None, {})
    pipe = pipeline.load_pipeline(base_runtime, str(model), None)
    counters = Counters(pipe.transformer)
    steps_run = args.prompts * args.steps
    reference: list[Any] | None = None
    residual_changes: list[float] = []
    output_changes: list[float] = []
    loads = [load_average()]
    print(f"{len(settings)} settings x {args.rounds} rounds x {args.prompts} images, {args.steps} steps, "
          f"{args.threads} thread(s); load {loads[0]}", flush=True)
    for round_number in range(args.rounds):
        # The uncached run opens and closes the round (its ratio base is the mean of the two),
        # so a load change during the round does not favour the settings measured late.
        order = [*settings, settings[0]]
        measured: list[tuple[Setting, float, float]] = []
        for setting in order:
            runtime = runtime_spec(model, texts, args.steps, setting.kind, setting.options)
            if setting.kind:
                options.apply_features(pipe, runtime)
            counters.reset()
            seconds, cpu, images = render_all(pipe, runtime, counters)
            if setting.kind:
                pipe.transformer.disable_cache()
            measured.append((setting, seconds, cpu))
            if setting.kind is None:
                residual_changes += counters.changes
                output_changes += counters.output_changes
                reference = reference or images
                if len(measured) > 1:
                    continue  # the closing uncached run: only its times count
            setting.attn_runs.append(counters.attn / steps_run)
            setting.mlp_runs.append(counters.mlp / steps_run)
            setting.psnr += [psnr(ref, got) for ref, got in zip(reference, images, strict=True)]
        base = [(seconds, cpu) for setting, seconds, cpu in measured if setting.kind is None]
        uncached, uncached_cpu = statistics.mean(b[0] for b in base), statistics.mean(b[1] for b in base)
        for setting, seconds, cpu in measured[:-1]:
            setting.seconds.append(seconds)
            setting.cpu_seconds.append(cpu)
            setting.ratios.append(uncached / seconds)
            setting.cpu_ratios.append(uncached_cpu / cpu)
            print(f"round {round_number + 1} {setting.label}: {seconds:.1f}s ({args.prompts / seconds:.3f} img/s, "
                  f"x{uncached / seconds:.2f}; CPU {cpu:.1f}s, x{uncached_cpu / cpu:.2f}), PSNR "
                  f"{min(setting.psnr[-args.prompts:]):.1f} dB, attn runs {setting.attn_runs[-1]:.0%}, MLP runs "
                  f"{setting.mlp_runs[-1]:.0%}", flush=True)
        print(f"round {round_number + 1}: uncached {base[0][0]:.1f}s / {base[1][0]:.1f}s wall, {base[0][1]:.1f}s / "
              f"{base[1][1]:.1f}s CPU at the start / end; load {load_average()}", flush=True)
        loads.append(load_average())
    counters.close()
    # What PSNR two unrelated images have (other prompt and seed, no cache): the floor that
    # says how much a figure like 30 dB means for this pipeline's images.
    floor = [psnr(a, b) for i, a in enumerate(reference or []) for b in (reference or [])[i + 1:]]
    report(settings, loads, residual_changes, output_changes, floor, args)
    if reference:
        print(f"uncached images' pixel standard deviation: "
              f"{statistics.median(float(image.std()) for image in reference):.1f} levels of 255")
    return 0


def report(settings: list[Setting], loads: list[str], changes: list[float], output_changes: list[float],
           floor: list[float], args: argparse.Namespace) -> None:
    print()
    print(f"{args.prompts} images x {args.rounds} rounds, {args.steps} steps, 256x256, {args.threads} thread(s); "
          f"load averages (1/5/15 min) at start and after each round: {' | '.join(loads)}")
    print()
    print("| setting | img/s (wall) | vs none, wall (median, min-max) | vs none, CPU time (median, min-max) | "
          "PSNR vs none (dB, min) | attn runs | MLP runs |")
    print("|---|---:|---:|---:|---:|---:|---:|")

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    for s in settings:
        rate = args.prompts / statistics.median(s.seconds)
        quality = "identical" if s.kind is None else (
            "inf (identical)" if min(s.psnr) == math.inf else f"{min(s.psnr):.1f}")
        print(f"| {s.label} | {rate:.3f} | {spread(s.ratios)} | {spread(s.cpu_ratios)} | {quality} | "
              f"{statistics.median(s.attn_runs):.0%} | {statistics.median(s.mlp_runs):.0%} |")
    if floor:
        print()
        print(f"PSNR between two unrelated uncached images (other prompt and seed): {statistics.median(floor):.1f} dB")
    for what, values in (("first-block residual", changes), ("transformer output", output_changes)):
        if values:
            quartiles = statistics.quantiles(values, n=4)
            print()
            print(f"{what} change from step to step (uncached, {len(values)} steps): median "
                  f"{statistics.median(values):.3f}, quartiles {quartiles[0]:.3f} / {quartiles[2]:.3f}, min "
                  f"{min(values):.3f}, max {max(values):.3f}")


if __name__ == "__main__":
    sys.exit(main())
