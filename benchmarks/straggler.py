#!/usr/bin/env python3
"""Straggler: 2 ranks, one slowed by extra compute; the dynamic (claimed chunks) vs the static plan.

    ~/.cache/muralist/venv/bin/python benchmarks/straggler.py [--items 64] [--steps 30] [--rounds 2]
        [--repeat 2] [--quick]

A DataParallel job of `--items` prompts (muralist/tiny-flux, 32x32, `--steps` steps: a few
tenths of a second per image on one CPU thread), run on this machine as `muralist run` runs it
(benchmarks/dataset_job.py's `run_job`: the same reader, RuntimeSpec and agent commands), in
two layouts:

- 1 pod x 2 processes (processesPerNode 2: one agent, one torchrun world of 2);
- 2 pods x 1 process (nodes 2: two agents, each its own torchrun world; they share only the
  claim store the first pod hosts);

each with the dynamic plan (the default: chunks claimed from the shared counter) and with
MURALIST_TEST_STATIC_PLAN=1 (a fixed contiguous share per rank), all four interleaved in every
round. Rank `--slow-rank` (1) renders each of its batches `--repeat` times
(MURALIST_TEST_RENDER_REPEAT, the first result kept): its items cost that many times the compute
(text encoding, every step, the VAE), as on a slower device, and it keeps its core busy, as a
slower device would (a sleep would hand its core to the other rank on this shared 2-core machine
and speed that one up). Repeating only the transformer's forward was tried first: on this tiny
model the transformer is a small part of a step, so it slowed a rank by ~10 %.

The ideal comes from outside the runs it judges: at the start of every round, a calibration runs
each kind of rank ALONE (a 1-process job of `--calibration-items` prompts, same model, size and
steps; once as it is, once with the slow rank's knob) and gives its seconds per image, t_fast and
t_slow (calibrating in every round, not once, follows the load of a shared machine: a single
calibration before two rounds was seen 40-80 % off by the end). Then, for each run of the round,

- ideal s = items / (1 / t_fast + 1 / t_slow): the job time if the work were split exactly by
  speed and each rank ran as fast as it did alone;
- job s = the generation span of the run: the last rank's end of generation minus the first
  rank's start, each rank's start being its end minus its generateSeconds (the runtime's own
  figure: first claim to last item written; from the pod's termination message, or for a pod's
  other local rank its "rendered N items in X s" log line);
- ratio = job s / ideal s.

The ratio can fail. A plan that leaves the fast rank idle while the slow one finishes (the static
plan: equal shares) shows (1 + q) / 2 with q = t_slow / t_fast (the "expected" column, from the
calibration alone); ranks that run slower together than alone (contention, a launch skew between
pods, time lost between chunks) push every plan above 1. Only a plan that keeps both ranks busy
to the end, at their own speeds, stays near 1. For the dynamic plan the expected figure is whole
chunks claimed greedily at the calibrated speeds (chunks are whole: a few large ones cannot
split 2:1 exactly). Ratios, ideals and expected ratios are medians of the rounds.

Also checked: every item exactly once, and the PNGs byte-identical across all runs (plan and
layout independence: seeds are a function of the item).

--quick: 8 items of 4 steps, 1 round, the 1 pod x 2 processes layout, the two calibration jobs
at once (about half a minute; the test suite runs it to check that the table prints).
"""

from __future__ import annotations

import argparse
import concurrent.futures
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
WORDS = ("red fox", "lighthouse", "castle", "owl", "robot", "boat", "city", "garden",
         "mountain", "river", "tower", "bridge", "forest", "train", "horse", "flower")
QUICK = {"items": 8, "steps": 4, "rounds": 1, "calibration_items": 4, "layouts": ["1x2"], "warm_up": False,
         "calibrate_together": True}


def prompts(n: int) -> list[str]:
    return [f"a {WORDS[i % len(WORDS)]} in the {('night', 'snow', 'rain', 'sun')[i % 4]}, number {i}"
            for i in range(n)]


@dataclass
class Measured:
    span_s: float  # first rank's start of generation -> last rank's end
    wall_s: float
    images: dict[int, int]  # rank -> images rendered
    generate: dict[int, float]  # rank -> generateSeconds

    def seconds_per_image(self, rank: int) -> float:
        return self.generate[rank] / self.images[rank]


@dataclass
class Alone:
    """Seconds per image of each kind of rank, each measured alone (a 1-process job)."""

    fast_s: float
    slow_s: float

    @property
    def q(self) -> float:
        return self.slow_s / self.fast_s

    def ideal_s(self, items: int) -> float:
        return items / (1 / self.fast_s + 1 / self.slow_s)

    def chunk_bound_s(self, chunks: list[int]) -> float:
        """Whole chunks claimed greedily in order at these speeds: the dynamic plan's best."""
        free = {"fast": 0.0, "slow": 0.0}
        per_image = {"fast": self.fast_s, "slow": self.slow_s}
        for size in chunks:
            who = min(free, key=lambda k: (free[k], k))
            free[who] += size * per_image[who]
        return max(free.values())


@dataclass
class Variant:
    name: str
    nodes: int
    processes: int
    static: bool
    runs: list[Measured] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)  # items per chunk, in chunk order
    outputs: list[Path] = field(default_factory=list)


def check_outputs(run: JobRun, items: int) -> None:
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


def measure(run: JobRun, items: int) -> Measured:
    check_outputs(run, items)
    images: dict[int, int] = {}
    for e in run.manifest():
        images[e["rank"]] = images.get(e["rank"], 0) + 1
    # (log time of the end of generation, items, seconds) per rank that logged it
    logged = [(t, int(m.group(1)), float(m.group(2))) for t, msg in run.log_lines() if (m := RENDERED.match(msg))]
    generate: dict[int, float] = {}
    ends: dict[int, float] = {}
    per_pod = len(run.terminations) > 1  # one agent per rank: every rank's termination message
    for node, term in enumerate(run.terminations):
        if "generateSeconds" not in term:
            raise SystemExit(f"{run.name}: no generateSeconds in pod {node}'s termination message: {term}")
        rank = node if per_pod else 0
        generate[rank] = term["generateSeconds"]
        match = min(logged, key=lambda x: (x[1] != images.get(rank, 0), abs(x[2] - generate[rank])))
        logged.remove(match)
        ends[rank] = match[0]
    for rank in sorted(images):
        if rank not in generate:  # a pod's other local rank: its log line
            match = next((x for x in logged if x[1] == images[rank]), None)
            if match is None:
                raise SystemExit(f"{run.name}: no 'rendered {images[rank]} items' log line for rank {rank}: {logged}")
            logged.remove(match)
            generate[rank], ends[rank] = match[2], match[0]
    if not set(images) <= set(generate):
        raise SystemExit(f"{run.name}: images by rank {images}, generateSeconds by rank {generate}")
    # A rank may render nothing: in a small job the other can claim every chunk before this one
    # has loaded. It took no part in the generation, so it does not stretch its span.
    working = [r for r in ends if images.get(r, 0) > 0]
    span = max(ends[r] for r in working) - min(ends[r] - generate[r] for r in working)
    return Measured(span, run.wall_s, images, generate)


def chunk_sizes(run: JobRun) -> list[int]:
    return [sum(1 for line in p.read_text().splitlines() if line.strip())
            for p in sorted((run.output / "parts").glob("chunk-*.jsonl"))]


def manifest_for(name: str, texts: list[str], steps: int, nodes: int, processes: int) -> dict[str, Any]:
    return job_manifest(name, None, texts, steps=steps, processes=processes, nodes=nodes)


def slow_knob(repeat: int, rank: int) -> dict[str, str]:
    return {"MURALIST_TEST_RENDER_REPEAT": str(repeat), "MURALIST_TEST_SLOW_RANK": str(rank)}


def calibrate(work: Path, label: str, steps: int, items: int, repeat: int, together: bool = False) -> Alone:
    """Each kind of rank alone: a 1-process job as it is, and one whose rank 0 has the knob; one
    after the other, or with `together` both at once (each on its own core: the quick mode's
    shortcut, not alone in the machine)."""
    kinds = (("fast", {}), ("slow", slow_knob(repeat, 0)))

    def per_image(kind: str, env: dict[str, str]) -> float:
        name = f"alone-{label.replace(' ', '-')}-{kind}"  # a DNS label
        m = measure(run_job(manifest_for(name, prompts(items), steps, 1, 1), work, name, env), items)
        return m.seconds_per_image(0)

    if together:
        with concurrent.futures.ThreadPoolExecutor(len(kinds)) as pool:
            fast_s, slow_s = pool.map(lambda kind: per_image(*kind), kinds)
    else:
        fast_s, slow_s = (per_image(*kind) for kind in kinds)
    alone = Alone(fast_s, slow_s)
    print(f"alone ({label}{', both at once' if together else ''}, {items} images each): fast {alone.fast_s:.3f} "
          f"s/image, slow {alone.slow_s:.3f} s/image (q = {alone.q:.2f}); load {load_average()}", flush=True)
    return alone


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
    parser.add_argument("--repeat", type=int, default=2, help="how many times the slow rank renders each batch")
    parser.add_argument("--calibration-items", type=int, default=16)
    parser.add_argument("--layouts", nargs="+", default=["1x2", "2x1"], choices=["1x2", "2x1"],
                        help="pods x processes per pod")
    parser.add_argument("--calibrate-together", action="store_true",
                        help="run the two calibration jobs at once (each on a core), not one after the other")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="no unmeasured job first (it builds muralist/tiny-flux if needed)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK}")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (outputs, logs)")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)

    work = Path(tempfile.mkdtemp(prefix="muralist-bench-straggler-"))
    loads = [load_average()]
    try:
        print(f"load average {loads[0]}", flush=True)
        if args.warm_up:  # builds muralist/tiny-flux if needed; page cache warm before anything is timed
            warm_up(work)
        texts = prompts(args.items)
        variants = []
        for layout in args.layouts:
            nodes, processes = (1, 2) if layout == "1x2" else (2, 1)
            label = "1 pod x 2 processes" if layout == "1x2" else "2 pods x 1 process"
            variants += [Variant(f"{label}, dynamic", nodes, processes, False),
                         Variant(f"{label}, static", nodes, processes, True)]
        knob = slow_knob(args.repeat, args.slow_rank)
        alones = []
        for rnd in range(args.rounds):
            alone = calibrate(work, f"round {rnd + 1}", args.steps, args.calibration_items, args.repeat,
                              args.calibrate_together)
            alones.append(alone)
            ideal = alone.ideal_s(args.items)
            for v in variants:
                name = f"r{rnd}-{v.nodes}x{v.processes}-{'static' if v.static else 'dynamic'}"
                env = {**knob, **({"MURALIST_TEST_STATIC_PLAN": "1"} if v.static else {})}
                run = run_job(manifest_for(name, texts, args.steps, v.nodes, v.processes), work, name, env)
                m = measure(run, args.items)
                v.runs.append(m)
                v.chunks = chunk_sizes(run)
                v.outputs.append(run.output)
                speeds = ", ".join(f"rank {r}: {m.images[r]} img in {m.generate[r]:.2f} s "
                                   f"({m.images[r] / m.generate[r]:.2f} img/s)" for r in sorted(m.images))
                print(f"round {rnd + 1} {v.name:34s} span {m.span_s:6.2f} s, ideal {ideal:6.2f} s, "
                      f"ratio {m.span_s / ideal:.2f}; wall {m.wall_s:.1f} s; {speeds}; "
                      f"chunks {v.chunks}; load {load_average()}", flush=True)
            loads.append(load_average())
        identical = compare_images(variants)
        ok = report(variants, args, alones, loads, identical)
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def report(variants: list[Variant], args: argparse.Namespace, alones: list[Alone], loads: list[str],
           identical: str) -> bool:
    """Each round's runs against that round's ideal (its own calibration); medians over the rounds."""
    med = statistics.median
    ideals = [a.ideal_s(args.items) for a in alones]
    speeds = "; ".join(f"round {i + 1}: {a.fast_s:.3f} / {a.slow_s:.3f} s/image (q = {a.q:.2f}), ideal "
                       f"{a.ideal_s(args.items):.2f} s" for i, a in enumerate(alones))
    print(f"\n{args.items} images, 32x32, {args.steps} steps, muralist/tiny-flux; rank {args.slow_rank} renders its "
          f"batches {args.repeat}x; alone (fast / slow), calibrated before each round: {speeds}; median of "
          f"{args.rounds} round(s); load average at the start and after each round: {' | '.join(loads)}")
    print(f"layout independence: {identical}\n")
    print("| layout, plan | job s (generation span) | ideal s (alone speeds) | ratio (per round) | "
          "expected ratio (alone speeds) | images per rank (fast / slow) | img/s per rank in the run (fast / slow) | "
          "wall s |")
    print("|---|---:|---:|---|---:|---|---|---:|")
    slow = args.slow_rank
    fast = next(r for r in range(2) if r != slow)

    def rate(m: Measured, rank: int) -> float:
        return m.images[rank] / m.generate[rank] if rank in m.images else 0.0

    for v in variants:
        ratios = [m.span_s / ideal for m, ideal in zip(v.runs, ideals, strict=True)]
        expected = [(1 + a.q) / 2 if v.static else a.chunk_bound_s(v.chunks) / a.ideal_s(args.items) for a in alones]
        split = ", ".join(f"{m.images.get(fast, 0)} / {m.images.get(slow, 0)}" for m in v.runs)
        speed = f"{med(rate(m, fast) for m in v.runs):.2f} / {med(rate(m, slow) for m in v.runs):.2f}"
        per_round = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"| {v.name} | {med(m.span_s for m in v.runs):.2f} | {med(ideals):.2f} | {med(ratios):.2f} ({per_round}) "
              f"| {med(expected):.2f} | {split} | {speed} | {med(m.wall_s for m in v.runs):.1f} |")
    return "NOT" not in identical


if __name__ == "__main__":
    sys.exit(main())
