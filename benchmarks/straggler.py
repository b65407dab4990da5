#!/usr/bin/env python3
"""Straggler: 2 ranks, one half as fast; the dynamic (claimed chunks) vs the static plan.

    ~/.cache/muralist/venv/bin/python benchmarks/straggler.py [--items 64] [--steps 30] [--rounds 2]
        [--sleep S]   # skip the calibration: the slow rank sleeps S s per step

A DataParallel job of `--items` prompts (muralist/tiny-flux, 32x32, `--steps` steps: a few
tenths of a second per image on one CPU thread), run on this machine as `muralist run` runs it
(benchmarks/dataset_job.py's `run_job`: the same reader, RuntimeSpec and agent commands), in
two layouts:

- 1 pod x 2 processes (processesPerNode 2: one agent, one torchrun world of 2);
- 2 pods x 1 process (nodes 2: two agents, each its own torchrun world; they share only the
  claim store the first pod hosts);

each with the dynamic plan (the default: chunks claimed from the shared counter) and with
MURALIST_TEST_STATIC_PLAN=1 (a fixed contiguous share per rank), interleaved per round.
Rank `--slow-rank` (1) is made half as fast with MURALIST_TEST_STEP_SLEEP, calibrated in two
short runs first (see `calibrate`): with no sleep, each rank's seconds per image t gives the
guess t / steps; with that sleep, the other rank's new speed (on a shared 2-core machine it
speeds up once the slow rank sleeps instead of computing) and the slow rank's own compute per
image give the corrected sleep that makes its time per image twice the other's.

Per run:
- job time = generateSeconds of the slowest rank (the runtime's own figure: from claiming the
  first chunk to the last item written). Not the wall time: that adds 10-30 s of interpreter
  start, imports, rendezvous, model load and the final merge, the same for both plans, which
  the ideal has no term for; it would pull every ratio toward 1. The wall time and the
  generation span (first rank's start of generation to the last rank's end, from the ranks'
  log timestamps: it also counts ranks that start at different times) are shown beside it.
- ideal = items / sum over ranks of (rank's images / its generateSeconds): the job time if
  the work were split exactly by speed, with the speeds measured in that same run.
- expected ratio: for the dynamic plan, the job time it gets at best with this job's chunks
  (read from the output's parts/) at those speeds, claimed greedily in order, over the ideal:
  chunks are whole, so a few large chunks cannot split 2:1 exactly (with 2 ranks the runtime
  cuts up to 256 rows into 8 chunks: at exactly half speed the best split of 8 equal chunks is
  5:3 or 6:2, 6 chunk-times against the ideal's 5.33, 1.125x); for the static plan
  (1 + q) / 2 with q the slow rank's seconds per image over the fast one's (1.5 at q = 2).

Each rank's generateSeconds: from its pod's termination message (each agent gets its own
file, as each pod has its own /dev/termination-log); a pod writes only its first local rank's,
so in the 1 pod x 2 processes layout the other rank's comes from its log line ("rendered N
items in X s", 0.1 s resolution). Images per rank: the manifest's `rank` field.
Also checked: every item exactly once, and the PNGs byte-identical across all runs (plan and
layout independence: seeds are a function of the item).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataset_job import JobRun, job_manifest, load_average, run_job, warm_up

RENDERED = re.compile(r"^rendered (\d+) items in ([\d.]+)s")
LOADED = re.compile(r"^pipeline loaded in ")
WORDS = ("red fox", "lighthouse", "castle", "owl", "robot", "boat", "city", "garden",
         "mountain", "river", "tower", "bridge", "forest", "train", "horse", "flower")
DYNAMIC_TARGET = 1.1


def prompts(n: int) -> list[str]:
    return [f"a {WORDS[i % len(WORDS)]} in the {('night', 'snow', 'rain', 'sun')[i % 4]}, number {i}"
            for i in range(n)]


@dataclass
class Measured:
    job_s: float  # slowest rank's generateSeconds
    span_s: float  # first generation start -> last generation end (log timestamps)
    wall_s: float
    images: dict[int, int]  # rank -> images rendered
    generate: dict[int, float]  # rank -> generateSeconds
    chunks: list[int]  # items per chunk, in chunk order

    @property
    def ideal_s(self) -> float:
        speed = sum(self.images[r] / self.generate[r] for r in self.images)
        return sum(self.images.values()) / speed

    def seconds_per_image(self, rank: int) -> float:
        return self.generate[rank] / self.images[rank]

    def chunk_bound_s(self) -> float:
        """Greedy claims in chunk order at the measured speeds: the dynamic plan's best."""
        free = {r: 0.0 for r in self.images}
        for size in self.chunks:
            r = min(free, key=lambda k: (free[k], k))
            free[r] += size * self.seconds_per_image(r)
        return max(free.values())


@dataclass
class Variant:
    name: str
    nodes: int
    processes: int
    static: bool
    runs: list[Measured] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)


def measure(run: JobRun, items: int) -> Measured:
    if not run.ok:
        raise SystemExit(run.failure())
    entries = run.manifest()
    keys = [e["key"] for e in entries]
    if len(keys) != items or len(set(keys)) != items or any(e["status"] != "rendered" for e in entries):
        raise SystemExit(f"{run.name}: {len(keys)} manifest entries ({len(set(keys))} distinct), expected {items} "
                         f"rendered, each once")
    pngs = list((run.output / "images").glob("*.png"))
    if len(pngs) != items:
        raise SystemExit(f"{run.name}: {len(pngs)} PNGs, expected {items}")
    images: dict[int, int] = {}
    for e in entries:
        images[e["rank"]] = images.get(e["rank"], 0) + 1
    lines = run.log_lines()
    logged = [(int(m.group(1)), float(m.group(2))) for _, msg in lines if (m := RENDERED.match(msg))]
    generate: dict[int, float] = {}
    per_pod = len(run.terminations) > 1  # one agent per rank: every rank's termination message
    for node, term in enumerate(run.terminations):
        if "generateSeconds" not in term:
            raise SystemExit(f"{run.name}: no generateSeconds in pod {node}'s termination message: {term}")
        rank = node if per_pod else 0
        generate[rank] = term["generateSeconds"]
        match = min(logged, key=lambda x: (x[0] != images.get(rank, 0), abs(x[1] - generate[rank])))
        logged.remove(match)
    for rank in sorted(images):
        if rank not in generate:  # a pod's other local rank: its log line
            n = images[rank]
            match = next((x for x in logged if x[0] == n), None)
            if match is None:
                raise SystemExit(f"{run.name}: no 'rendered {n} items' log line for rank {rank}: {logged}")
            logged.remove(match)
            generate[rank] = match[1]
    if set(images) != set(generate):
        raise SystemExit(f"{run.name}: images by rank {images}, generateSeconds by rank {generate}")
    starts = [t for t, msg in lines if LOADED.match(msg)]
    ends = [t for t, msg in lines if RENDERED.match(msg)]
    chunks = [sum(1 for line in p.read_text().splitlines() if line.strip())
              for p in sorted((run.output / "parts").glob("chunk-*.jsonl"))]
    return Measured(max(generate.values()), max(ends) - min(starts), run.wall_s, images, generate, chunks)


def manifest_for(name: str, texts: list[str], steps: int, nodes: int, processes: int) -> dict[str, Any]:
    return job_manifest(name, None, texts, steps=steps, processes=processes, nodes=nodes)


def calibrate(work: Path, steps: int, items: int, slow: int) -> float:
    """The sleep per step that makes rank `slow` take twice the other's time per image, in
    two runs (1 pod x 2 processes, dynamic plan): with no sleep, each rank's s/image t gives
    the first guess t / steps; a second run with that sleep shows how the other rank's speed
    moved (on a shared machine it gets faster once the slow one sleeps instead of computing)
    and what the slow one computes per image; the sleep is corrected once from those."""
    run = run_job(manifest_for("calibrate-0", prompts(items), steps, 1, 2), work, "calibrate-0")
    m = measure(run, items)
    base = statistics.mean(m.seconds_per_image(r) for r in m.images)
    guess = base / steps
    print(f"calibration 1 ({items} images, {steps} steps, no sleep): "
          + ", ".join(f"rank {r} {m.seconds_per_image(r):.3f} s/image ({m.images[r]} images)"
                      for r in sorted(m.images))
          + f" -> {guess * 1000:.2f} ms per step; load {load_average()}", flush=True)
    env = {"MURALIST_TEST_STEP_SLEEP": f"{guess:.6f}", "MURALIST_TEST_SLOW_RANK": str(slow)}
    run = run_job(manifest_for("calibrate-1", prompts(items), steps, 1, 2), work, "calibrate-1", env)
    m = measure(run, items)
    fast = next(r for r in m.images if r != slow)
    if slow not in m.images:
        raise SystemExit(f"calibration: rank {slow} rendered nothing: {m.images}")
    t_fast, t_slow = m.seconds_per_image(fast), m.seconds_per_image(slow)
    compute = max(0.0, t_slow - steps * guess)  # the slow rank's own work per image
    sleep = max(0.0, (2 * t_fast - compute) / steps)
    print(f"calibration 2 (sleep {guess * 1000:.2f} ms per step): rank {fast} {t_fast:.3f} s/image, rank {slow} "
          f"{t_slow:.3f} s/image (ratio {t_slow / t_fast:.2f}, of which computing {compute:.3f} s) -> "
          f"{sleep * 1000:.2f} ms per step; load {load_average()}", flush=True)
    return sleep


def compare_images(variants: list[Variant]) -> str:
    """Byte-identical PNGs across every run (the first run is the reference)?"""
    outputs = [(v.name, i, out) for v in variants for i, out in enumerate(v.outputs)]
    ref_name, _, ref = outputs[0]
    reference = {p.name: p.read_bytes() for p in (ref / "images").glob("*.png")}
    bad = []
    for name, i, out in outputs[1:]:
        got = {p.name: p.read_bytes() for p in (out / "images").glob("*.png")}
        if got.keys() != reference.keys():
            bad.append(f"{name} round {i + 1}: other file names")
            continue
        differ = sum(got[k] != reference[k] for k in reference)
        if differ:
            bad.append(f"{name} round {i + 1}: {differ} of {len(reference)} PNGs differ")
    if bad:
        return "NOT identical: " + "; ".join(bad)
    return (f"all {len(reference)} PNGs byte-identical across all {len(outputs)} runs "
            f"(reference: {ref_name} round 1)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=None, help="seconds per step; default: calibrated")
    parser.add_argument("--calibration-items", type=int, default=16)
    parser.add_argument("--layouts", nargs="+", default=["1x2", "2x1"], choices=["1x2", "2x1"],
                        help="pods x processes per pod")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (outputs, logs)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="muralist-bench-straggler-"))
    loads = []
    try:
        print(f"load average {load_average()}", flush=True)
        if args.sleep is None:  # its first run also builds muralist/tiny-flux if needed (before timing)
            args.sleep = calibrate(work, args.steps, args.calibration_items, args.slow_rank)
        else:
            warm_up(work)
        loads.append(load_average())
        texts = prompts(args.items)
        variants = []
        for layout in args.layouts:
            nodes, processes = (1, 2) if layout == "1x2" else (2, 1)
            label = "1 pod x 2 processes" if layout == "1x2" else "2 pods x 1 process"
            variants += [Variant(f"{label}, dynamic", nodes, processes, False),
                         Variant(f"{label}, static", nodes, processes, True)]
        knobs = {"MURALIST_TEST_STEP_SLEEP": f"{args.sleep:.6f}", "MURALIST_TEST_SLOW_RANK": str(args.slow_rank)}
        for rnd in range(args.rounds):
            for v in variants:
                name = f"r{rnd}-{v.nodes}x{v.processes}-{'static' if v.static else 'dynamic'}"
                env = {**knobs, **({"MURALIST_TEST_STATIC_PLAN": "1"} if v.static else {})}
                run = run_job(manifest_for(name, texts, args.steps, v.nodes, v.processes), work, name, env)
                m = measure(run, args.items)
                v.runs.append(m)
                v.outputs.append(run.output)
                speeds = ", ".join(f"rank {r}: {m.images[r]} img in {m.generate[r]:.2f} s "
                                   f"({m.images[r] / m.generate[r]:.2f} img/s)" for r in sorted(m.images))
                print(f"round {rnd + 1} {v.name:34s} job {m.job_s:6.2f} s, ideal {m.ideal_s:6.2f} s, "
                      f"ratio {m.job_s / m.ideal_s:.2f} (whole-chunk bound {m.chunk_bound_s() / m.ideal_s:.2f}); "
                      f"span {m.span_s:.2f} s, wall {m.wall_s:.1f} s; {speeds}; chunks {m.chunks}; "
                      f"load {load_average()}", flush=True)
            loads.append(load_average())
        identical = compare_images(variants)
        ok = report(variants, args, loads, identical)
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def report(variants: list[Variant], args: argparse.Namespace, loads: list[str], identical: str) -> bool:
    med = statistics.median
    print(f"\n{args.items} images, 32x32, {args.steps} steps, muralist/tiny-flux; rank {args.slow_rank} sleeps "
          f"{args.sleep * 1000:.2f} ms per step; median of {args.rounds} rounds (load average before/after each "
          f"round: {' | '.join(loads)})")
    print(f"layout independence: {identical}\n")
    print("| layout, plan | job s (slowest rank's generateSeconds) | ideal s | ratio (per round) | "
          "expected ratio | slow/fast s per image (q) | images per rank (fast / slow) | "
          "img/s per rank (fast / slow) | generation span s | wall s |")
    print("|---|---:|---:|---|---:|---:|---|---|---:|---:|")
    ok = "NOT" not in identical
    for v in variants:
        ratios = [m.job_s / m.ideal_s for m in v.runs]
        slow = args.slow_rank
        fast = next(r for r in v.runs[0].images if r != slow)
        q = [m.seconds_per_image(slow) / m.seconds_per_image(fast) for m in v.runs]
        # dynamic: the best split into whole chunks at the run's speeds; static: equal shares,
        # (1 + q) / 2 (1.5 at exactly half speed)
        expected = [(1 + qq) / 2 if v.static else m.chunk_bound_s() / m.ideal_s
                    for m, qq in zip(v.runs, q, strict=True)]
        split = ", ".join(f"{m.images.get(fast, 0)} / {m.images.get(slow, 0)}" for m in v.runs)
        speed = (f"{med(m.images[fast] / m.generate[fast] for m in v.runs):.2f} / "
                 f"{med(m.images[slow] / m.generate[slow] for m in v.runs):.2f}")
        print(f"| {v.name} | {med(m.job_s for m in v.runs):.2f} | {med(m.ideal_s for m in v.runs):.2f} | "
              f"{med(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) | {med(expected):.2f} | "
              f"{med(q):.2f} | {split} | {speed} | {med(m.span_s for m in v.runs):.2f} | "
              f"{med(m.wall_s for m in v.runs):.1f} |")
        if not v.static:
            ok &= med(ratios) <= DYNAMIC_TARGET
    print(f"\ntarget (dynamic plan within {DYNAMIC_TARGET}x of ideal, median): {'met' if ok else 'MISSED'}; "
          f"the static plan's expected ratio at exactly half speed: 1.5")
    return ok


if __name__ == "__main__":
    sys.exit(main())
