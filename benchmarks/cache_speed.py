#!/usr/bin/env python3
"""Step caches on a model that has learned something: the speed-up of each generation.cache
setting against no cache, and what it costs (PSNR, SSIM and prompt adherence against the
uncached images of the same seeds), in one interleaved run on the trained muralist/tiny-shapes-flux.

    ~/.cache/muralist/venv/bin/python benchmarks/cache_speed.py [--rounds 3] [--prompts 90]
        [--threads 1] [--only "FirstBlockCache 0.1" ...] [--quick]

The model draws the coloured shape a caption names (runtime/muralist_runtime/model/shapes.py);
it renders 64x64 in 8 steps, the settings it was trained and evaluated at. The prompts are every
caption of its world at seeds training never used (shapes.evaluation_prompts). Everything runs in
this one process through the runtime's own code: features.apply_features (a job's
generation.cache) and call.render_checked (the call every rank makes), one image per call.

Rounds interleave the settings (none, A, B, ..., none, then again), so drift in the machine's
load hits them alike; each round's ratio is against the mean of that round's two uncached runs.
Two speed ratios: wall time, and this process's CPU time (with one thread, the work done: much
less sensitive to what else runs on a shared machine). The quality columns compare each image
with the uncached image of the same prompt and seed (step_cache/quality.py: PSNR over the 8-bit
pixels, SSIM on luminance with a Gaussian window); adherence is the share of images whose shape,
colour and background read back as the prompt asked, and "same as none" the share that read
back exactly as the uncached image did.

The two control rows are no caches but broken ones, for the same seeds: the transformer's output
of the first step reused for every later step (a cache that skips every step after the first),
and that output zeroed on every later step (the sampler stops moving: an image of noise). They
show what each quality column says of an image a cache has ruined, and that speed alone proves
nothing.
"attn / MLP runs": how often the last single block's attention (attn.to_q) and MLP (proj_mlp)
really ran, per denoising step (100 % = never skipped).

MagCache runs with diffusers' published FLUX.1-dev ratios and with ratios calibrated for this
model: the job's way (options.calibrate, step_cache/calibration.py) on the first prompt, once
before the rounds, then passed to each round as options.ratios (what a later job reuses), so the
calibration render is not timed.

--quick: a few prompts, one round, four settings and the controls (under a minute; the test
suite runs it to check that the script runs to its table; its figures mean little).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MODEL = "muralist/tiny-shapes-flux"
STEPS = 8  # what the model was trained and evaluated at
CONTROL = "control: step 1 reused for steps 2-8"
ZEROED = "control: output zeroed on steps 2-8"
CONTROLS = (CONTROL, ZEROED)

# (label, cache type, options): mild to aggressive per cache; None: no cache.
SETTINGS: list[tuple[str, str | None, dict[str, Any]]] = [
    ("none", None, {}),
    ("FirstBlockCache 0.05 (default)", "FirstBlockCache", {"threshold": 0.05}),
    ("FirstBlockCache 0.1", "FirstBlockCache", {"threshold": 0.1}),
    ("FirstBlockCache 0.2", "FirstBlockCache", {"threshold": 0.2}),
    ("FirstBlockCache 0.4", "FirstBlockCache", {"threshold": 0.4}),
    ("FirstBlockCache 0.8", "FirstBlockCache", {"threshold": 0.8}),
    ("TaylorSeer interval 5 (default)", "TaylorSeer", {}),
    ("TaylorSeer interval 3", "TaylorSeer", {"cacheInterval": 3}),
    ("TaylorSeer interval 2, order 2", "TaylorSeer", {"cacheInterval": 2, "maxOrder": 2}),
    ("MagCache 0.06, FLUX.1-dev ratios (default)", "MagCache", {}),
    ("MagCache 0.24, 5 skips, FLUX.1-dev ratios", "MagCache", {"threshold": 0.24, "maxSkipSteps": 5}),
    ("MagCache 0.06, calibrated on this model", "MagCache", {"calibrate": True}),
    ("MagCache 0.24, 5 skips, calibrated", "MagCache", {"calibrate": True, "threshold": 0.24, "maxSkipSteps": 5}),
    ("FasterCache (default)", "FasterCache", {}),
    ("PyramidAttentionBroadcast 2", "PyramidAttentionBroadcast", {"spatialAttentionBlockSkipRange": 2}),
    (CONTROL, None, {}),
    (ZEROED, None, {}),
]
QUICK = ["none", "FirstBlockCache 0.1", "FirstBlockCache 0.8", "MagCache 0.06, calibrated on this model", *CONTROLS]
QUICK_PROMPTS = 6


@dataclass
class Setting:
    label: str
    kind: str | None
    options: dict[str, Any]
    ratios: list[float] = field(default_factory=list)  # per round: images/s vs that round's uncached (wall)
    cpu_ratios: list[float] = field(default_factory=list)  # the same in this process's CPU time
    seconds: list[float] = field(default_factory=list)  # per round, all prompts (wall)
    psnr: list[float] = field(default_factory=list)  # per image, last round
    ssim: list[float] = field(default_factory=list)
    adheres: list[bool] = field(default_factory=list)
    same: list[bool] = field(default_factory=list)  # read back as the uncached image was
    attn_runs: list[float] = field(default_factory=list)
    mlp_runs: list[float] = field(default_factory=list)

    @property
    def baseline(self) -> bool:
        return self.kind is None and self.label not in CONTROLS


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def runtime_spec(prompts: list[tuple[str, int]], kind: str | None, options: dict[str, Any]) -> Any:
    from muralist_api.runtime_spec import RuntimeSpec
    from muralist_runtime.model import bundled, shapes

    generation: dict[str, Any] = {"steps": STEPS, "height": shapes.SIZE, "width": shapes.SIZE,
                                  "extraArgs": {"max_sequence_length": bundled.SHAPES_TEXT_TOKENS}}
    if kind:
        generation["cache"] = {"type": kind, "options": options}
    return RuntimeSpec.model_validate({
        "name": "cache-bench", "outputDir": "/unused",
        "spec": {"model": {"name": MODEL, "dtype": "float32"},
                 "prompts": [{"text": text, "seed": seed} for text, seed in prompts],
                 "generation": generation, "parallelism": {"gpusPerNode": 0}},
    })


class Counters:
    """Calls of the last single block's attention and MLP (what the caches skip)."""

    def __init__(self, transformer: Any):
        last = transformer.single_transformer_blocks[-1]
        self.attn = self.mlp = 0
        self._handles = [last.attn.to_q.register_forward_hook(lambda *_: self._count("attn")),
                         last.proj_mlp.register_forward_hook(lambda *_: self._count("mlp"))]

    def _count(self, what: str) -> None:
        setattr(self, what, getattr(self, what) + 1)

    def reset(self) -> None:
        self.attn = self.mlp = 0

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def break_later_steps(transformer: Any, steps: int, zeroed: bool) -> Callable[[], None]:
    """A control: the transformer's output of each image's first step returned for its later
    steps (a cache that skips them all), or zeros in its place. Returns what undoes it."""
    import torch

    forward = transformer.forward
    calls = [0]
    first: list[Any] = [None]

    def broken(*args: Any, **kwargs: Any) -> Any:
        if calls[0] % steps == 0:
            first[0] = forward(*args, **kwargs)
        calls[0] += 1
        if zeroed and calls[0] % steps != 1:
            return (torch.zeros_like(first[0][0]),)  # Flux returns (sample,) with return_dict=False
        return first[0]

    transformer.forward = broken
    return lambda: transformer.__dict__.pop("forward", None)


def render_all(pipe: Any, runtime: Any) -> tuple[float, float, list[Any]]:
    """(wall seconds, CPU seconds of this process, the images' 8-bit pixels) for the job's items."""
    from muralist_runtime.model import call
    from muralist_runtime.work import rows

    source = rows.open_rows(runtime)
    items = rows.items_of(source.rows(0, source.count()), runtime.spec.generation)
    start, cpu = time.perf_counter(), time.process_time()
    out = []
    for item in items:  # one image per call, as a batchSize 1 job
        output, reason = call.render_checked(pipe, runtime, [item])[0]
        assert reason is None, reason
        out.append(output.pixels())
    return time.perf_counter() - start, time.process_time() - cpu, out


def measure_quality(setting: Setting, prompts: list[tuple[str, int]], reference: list[Any],
                    images: list[Any]) -> None:
    import numpy as np
    from muralist_runtime.model import shapes
    from muralist_runtime.step_cache import quality

    setting.psnr, setting.ssim, setting.adheres, setting.same = [], [], [], []
    for (text, _), ref, got in zip(prompts, reference, images, strict=True):
        setting.psnr.append(quality.psnr(ref, got))
        setting.ssim.append(quality.ssim(ref, got))
        setting.adheres.append(shapes.adheres(text, got.astype(np.uint8)))
        setting.same.append(shapes.read_back(got.astype(np.uint8)) == shapes.read_back(ref.astype(np.uint8)))


def run_setting(pipe: Any, setting: Setting, prompts: list[tuple[str, int]], counters: Counters) -> tuple[
        float, float, list[Any]]:
    from muralist_runtime.model import features

    runtime = runtime_spec(prompts, setting.kind, setting.options)
    undo = None
    if setting.kind:
        features.apply_features(pipe, runtime)
    elif not setting.baseline:
        undo = break_later_steps(pipe.transformer, STEPS, zeroed=setting.label == ZEROED)
    counters.reset()
    try:
        return render_all(pipe, runtime)
    finally:
        if setting.kind:
            pipe.transformer.disable_cache()
        if undo is not None:
            undo()


def calibrate_once(pipe: Any, prompts: list[tuple[str, int]], settings: list[Setting]) -> list[float] | None:
    """Settings that ask MagCache to calibrate get the ratios the job's way, measured once on the
    first prompt, as options.ratios; the ratios, or None when no setting asks."""
    from muralist_runtime.model import call, features
    from muralist_runtime.step_cache import calibration
    from muralist_runtime.work import rows

    asking = [s for s in settings if s.options.get("calibrate")]
    if not asking:
        return None
    runtime = runtime_spec(prompts[:1], "MagCache", {"calibrate": True})
    features.apply_features(pipe, runtime)
    source = rows.open_rows(runtime)
    first = rows.items_of(source.rows(0, 1), runtime.spec.generation)[0]
    ratios: list[float] = calibration.calibrate(pipe, runtime, first, call.render)["ratios"]
    pipe.transformer.disable_cache()
    for setting in asking:
        setting.options = {**{k: v for k, v in setting.options.items() if k != "calibrate"}, "ratios": ratios}
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=90, help="90: every caption of the shapes world once")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="+", default=None, help="labels of SETTINGS to run (none is always run)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_PROMPTS} prompts, 1 round, {len(QUICK)} "
                        "settings: checks that the script runs (the test suite does)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.prompts, args.only = 1, QUICK_PROMPTS, QUICK

    import torch
    from muralist_runtime.model import loading, resolve, shapes

    torch.set_num_threads(args.threads)
    prompts = shapes.evaluation_prompts(args.prompts)
    settings = [Setting(label, kind, opts) for label, kind, opts in SETTINGS
                if label == "none" or args.only is None or label in args.only]
    base_runtime = runtime_spec(prompts, None, {})
    pipe = loading.load_pipeline(base_runtime, *resolve.resolve_model(base_runtime))
    counters = Counters(pipe.transformer)
    steps_run = args.prompts * STEPS
    reference: list[Any] | None = None
    render_all(pipe, runtime_spec(prompts[:1], None, {}))  # warm-up: the first call pays one-off costs
    ratios = calibrate_once(pipe, prompts, settings)
    if ratios is not None:
        print(f"MagCache ratios calibrated on {prompts[0][0]!r} (seed {prompts[0][1]}): "
              f"{', '.join(f'{r:.4f}' for r in ratios)}", flush=True)
    loads = [load_average()]
    print(f"{len(settings)} settings x {args.rounds} rounds x {args.prompts} images, {STEPS} steps, 64x64, "
          f"{args.threads} thread(s); load {loads[0]}", flush=True)
    for round_number in range(args.rounds):
        # The uncached run opens and closes the round (its ratio base is the mean of the two),
        # so a load change during the round does not favour the settings measured late.
        measured: list[tuple[Setting, float, float]] = []
        for setting in [*settings, settings[0]]:
            seconds, cpu, images = run_setting(pipe, setting, prompts, counters)
            measured.append((setting, seconds, cpu))
            if setting.baseline:
                reference = reference or images
                if len(measured) > 1:
                    continue  # the closing uncached run: only its times count
            setting.attn_runs.append(counters.attn / steps_run)
            setting.mlp_runs.append(counters.mlp / steps_run)
            assert reference is not None
            measure_quality(setting, prompts, reference, images)
        base = [(seconds, cpu) for setting, seconds, cpu in measured if setting.baseline]
        uncached, uncached_cpu = statistics.mean(b[0] for b in base), statistics.mean(b[1] for b in base)
        for setting, seconds, cpu in measured[:-1]:
            setting.seconds.append(seconds)
            setting.ratios.append(uncached / seconds)
            setting.cpu_ratios.append(uncached_cpu / cpu)
            print(f"round {round_number + 1} {setting.label}: {seconds:.2f}s, x{uncached / seconds:.2f} (CPU "
                  f"x{uncached_cpu / cpu:.2f}), PSNR min {min(setting.psnr):.1f} dB, SSIM min {min(setting.ssim):.3f}, "
                  f"adherence {statistics.mean(setting.adheres):.0%}", flush=True)
        loads.append(load_average())
        print(f"round {round_number + 1}: uncached {base[0][0]:.2f}s / {base[1][0]:.2f}s at the start / end; load "
              f"{loads[-1]}", flush=True)
    counters.close()
    report(settings, loads, args)
    return 0


def _db(value: float) -> str:
    return "inf" if value == math.inf else f"{value:.1f}"


def report(settings: list[Setting], loads: list[str], args: argparse.Namespace) -> None:
    print()
    print(f"{MODEL}, {args.prompts} prompts (unseen seeds) x {args.rounds} round(s), {STEPS} steps, 64x64, "
          f"{args.threads} thread(s); load averages (1/5/15 min) at the start and after each round: "
          f"{' | '.join(loads)}")
    print()
    print("| setting | img/s | speed-up, wall (median, min-max) | speed-up, CPU | PSNR vs none, dB (min / median) | "
          "SSIM vs none (min / median) | adherence | same read-back as none | attn runs | MLP runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    for s in settings:
        rate = args.prompts / statistics.median(s.seconds)
        quality = (f"{_db(min(s.psnr))} / {_db(statistics.median(s.psnr))} | "
                   f"{min(s.ssim):.3f} / {statistics.median(s.ssim):.3f}")
        print(f"| {s.label} | {rate:.1f} | {spread(s.ratios)} | {spread(s.cpu_ratios)} | {quality} | "
              f"{statistics.mean(s.adheres):.1%} | {statistics.mean(s.same):.1%} | "
              f"{statistics.median(s.attn_runs):.0%} | {statistics.median(s.mlp_runs):.0%} |")


if __name__ == "__main__":
    sys.exit(main())
