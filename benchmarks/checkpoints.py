#!/usr/bin/env python3
"""Checkpoints inside an item: a long-item video job preempted three times against the same job run straight.

    ~/.cache/muralist/venv/bin/python benchmarks/checkpoints.py [--items 4] [--steps 600] [--every 50]
        [--rounds 3] [--seed 38] [--quick]

The job: `--items` prompts of muralist/tiny-wan (random weights), 96x96, 33 frames, `--steps` steps, one
process, mp4 files, with runPolicy.checkpoint everySteps `--every` (onTerminate true). It runs on this machine as
`muralist run` runs it (benchmarks/dataset_job.py's launch: the same reader, RuntimeSpec and agent command, the
pod contract's launch entry point), in three arms, interleaved in every round:

- plain: the job without runPolicy.checkpoint, straight: the baseline of a step's time;
- straight: the job with its checkpoints, never stopped (what the periodic saves and the per-step notes cost);
- preempted: the job with its checkpoints, stopped three times at seeded random points of its rendering time
  (SIGTERM to the agent, as the kubelet's to a pod: it drains, saving the item in flight where it is, and exits
  143), started again each time (a pod started again; its item resumes from its checkpoint), then run to the end.

Rendering time is what a run spends rendering: from the log line that says the pipeline is loaded to the one that
says the run drained or rendered its items, summed over a run's attempts (a restart's interpreter start and model
load are the restart's, not the render's: they are printed apart, as `restart s`). The stop points are drawn as
fractions of the straight arm's rendering time of the round, uniform in (0.1, 0.9), sorted, one in each of the
first three attempts. An unmeasured short run warms the machine up first. Checked: every item's mp4 identical,
byte for byte, in the three arms; the preempted items' resumedFromStep > 0.

The write cost per checkpoint: the runtime's own checkpointSeconds / checkpointsWritten (capturing the state and
writing it whole, fsync and rename: the straight arm's job file), as a share of one step: plain's rendering time
per step, its VAE decodes and text encoding left out (a run of the same job at `--steps` / 10 steps gives them:
the difference is steps alone). Ratios and figures are medians over the rounds.

--quick: 2 items of 40 steps at 32x32x9, everySteps 8, one round (the suite runs it: the table prints).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataset_job import LOG_TIME, bench_env, load_average

STOPS = 3
QUICK = {"items": 2, "steps": 40, "every": 8, "rounds": 1, "size": 32, "frames": 9}
GENERATING = "pipeline loaded"
ENDED = ("rendered ", "drained:")


def manifest(items: int, steps: int, every: int | None, size: int, frames: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "muralist/tiny-wan", "dtype": "float32"},
        "prompts": [f"a red fox in the snow, number {i}" for i in range(items)],
        "generation": {"steps": steps, "height": size, "width": size, "numFrames": frames, "fps": 8,
                       "extraArgs": {"max_sequence_length": 32}},
        "parallelism": {"strategy": "DataParallel", "nodes": 1, "gpusPerNode": 0, "processesPerNode": 1},
        "output": {"format": "mp4"},
    }
    if every is not None:
        spec["runPolicy"] = {"checkpoint": {"everySteps": every}}
    return {"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob", "metadata": {"name": "ckpt"},
            "spec": spec}


@dataclass
class Attempt:
    code: int
    log: str
    render_s: float
    start_s: float  # launch to the pipeline loaded: a restart's own cost


@dataclass
class Arm:
    attempts: list[Attempt] = field(default_factory=list)
    output: Path | None = None

    @property
    def render_s(self) -> float:
        return sum(a.render_s for a in self.attempts)

    @property
    def restart_s(self) -> float:
        return sum(a.start_s for a in self.attempts[1:])


def _stamps(log: str) -> list[tuple[float, str]]:
    out = []
    for line in log.splitlines():
        m = LOG_TIME.match(line.strip())
        if m:
            stamp = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + int(m.group(1)[20:]) / 1000
            out.append((stamp, m.group(2)))
    return out


def launch(job: dict[str, Any], work: Path, name: str, out: Path, stop_after: float | None) -> Attempt:
    """One attempt: the agent the pod contract starts; SIGTERM once it has rendered `stop_after` seconds."""
    from muralist_api import contract
    from muralist_runtime import local

    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    parsed, _ = local.load_job(str(path))
    runtime = local.runtime_spec(parsed, str(out), None, None)
    out.mkdir(parents=True, exist_ok=True)
    spec_file = work / f"{name}.spec.json"
    spec_file.write_text(runtime.model_dump_json(by_alias=True, exclude_none=True))
    (argv, agent_env), = local.agent_commands(runtime, str(spec_file), *local.local_ports(1))
    log_path = work / f"{name}.log"
    env = {**bench_env(), **agent_env, contract.MURALIST_LOCAL: "1",
           contract.MURALIST_TERMINATION_LOG: str(work / f"{name}.termination"),
           contract.MURALIST_PROGRESS_DIR: str(work / f"{name}.progress")}
    launched = time.time()
    with open(log_path, "wb") as f:
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)
        if stop_after is not None:
            while proc.poll() is None and not any(GENERATING in m for _, m in _stamps(log_path.read_text())):
                time.sleep(0.02)
            time.sleep(stop_after)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=1800)
    log = log_path.read_text(errors="replace")
    stamps = _stamps(log)
    began = next((t for t, m in stamps if GENERATING in m), None)
    ended = next((t for t, m in stamps if m.startswith(ENDED)), None)
    if began is None or ended is None:
        raise SystemExit(f"{name}: exit {code}, no generation span in its log\n{log[-3000:]}")
    return Attempt(code, log, ended - began, began - launched)


def run_arm(job: dict[str, Any], work: Path, name: str, stops: list[float]) -> Arm:
    """The job to its end, stopped once after each of `stops` seconds of rendering (each in its own attempt)."""
    arm = Arm(output=work / name)
    for i, after in enumerate([*stops, None]):
        attempt = launch(job, work, f"{name}-{i}", arm.output, after)
        arm.attempts.append(attempt)
        if after is None and attempt.code != 0:
            raise SystemExit(f"{name}: exit {attempt.code}\n{attempt.log[-3000:]}")
    return arm


def videos(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "images").glob("*.mp4")) if p.stem.count(".") == 0}


def job_file(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / "job.json").read_text())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    size, frames = 96, 33
    if args.quick:
        args.items, args.steps, args.every, args.rounds = (QUICK[k] for k in ("items", "steps", "every", "rounds"))
        size, frames = QUICK["size"], QUICK["frames"]
    rng = random.Random(args.seed)
    plain_job = manifest(args.items, args.steps, None, size, frames)
    job = manifest(args.items, args.steps, args.every, size, frames)
    short = manifest(args.items, max(1, args.steps // 10), None, size, frames)
    print(f"checkpoints: {args.items} items x {args.steps} steps of muralist/tiny-wan at {size}x{size}x{frames}, "
          f"everySteps {args.every}, {STOPS} stops, {args.rounds} round(s); load average {load_average()}")
    rows: dict[str, list[float]] = {k: [] for k in ("plain", "straight", "preempted", "restart", "straight/plain",
                                                    "preempted/straight", "preempted/plain", "step_ms",
                                                    "write_ms", "write/step", "resumed")}
    work = Path(tempfile.mkdtemp(prefix="muralist-bench-ckpt-"))
    try:
        run_arm(short, work, "warm-up", [])  # unmeasured: the tiny model built, the page cache warm
        for r in range(args.rounds):
            print(f"round {r + 1}: load average {load_average()}", flush=True)
            arms: dict[str, Arm] = {}
            order = ["plain", "straight", "short", "preempted"] if r % 2 == 0 else \
                ["preempted", "short", "straight", "plain"]
            straight_s = None
            for arm in order:
                if arm == "preempted":
                    base = straight_s if straight_s is not None else None
                    if base is None:  # preempted first this round: the last round's straight time stands in
                        base = rows["straight"][-1] if rows["straight"] else 0.0
                    if not base:
                        base = run_arm(job, work, f"r{r}-calibrate", []).render_s
                    points = sorted(rng.uniform(0.1, 0.9) * base for _ in range(STOPS))
                    stops = [b - a for a, b in zip([0.0, *points[:-1]], points, strict=True)]
                    arms[arm] = run_arm(job, work, f"r{r}-{arm}", stops)
                else:
                    arms[arm] = run_arm({"plain": plain_job, "straight": job, "short": short}[arm], work,
                                        f"r{r}-{arm}", [])
                    if arm == "straight":
                        straight_s = arms[arm].render_s
            plain, straight, preempted = arms["plain"], arms["straight"], arms["preempted"]
            assert plain.output and straight.output and preempted.output
            same = videos(plain.output) == videos(straight.output) == videos(preempted.output)
            if not same or len(videos(plain.output)) != args.items:
                raise SystemExit(f"round {r + 1}: the arms' videos differ")
            drained = sum(1 for a in preempted.attempts if a.code == 143)
            manifest_rows = [json.loads(x) for x in (preempted.output / "manifest.jsonl").read_text().splitlines()]
            resumed = [m["resumedFromStep"] for m in manifest_rows if m.get("resumedFromStep")]
            recorded = job_file(straight.output)
            steps_s = (plain.render_s - arms["short"].render_s) / (args.items * (args.steps - max(1, args.steps // 10)))
            write_s = recorded.get("checkpointSeconds", 0.0) / max(1, recorded.get("checkpointsWritten", 0))
            for key, value in (("plain", plain.render_s), ("straight", straight.render_s),
                               ("preempted", preempted.render_s), ("restart", preempted.restart_s),
                               ("straight/plain", straight.render_s / plain.render_s),
                               ("preempted/straight", preempted.render_s / straight.render_s),
                               ("preempted/plain", preempted.render_s / plain.render_s),
                               ("step_ms", steps_s * 1000), ("write_ms", write_s * 1000),
                               ("write/step", write_s / steps_s), ("resumed", len(resumed))):
                rows[key].append(value)
            print(f"  plain {plain.render_s:.2f} s, straight {straight.render_s:.2f} s, preempted "
                  f"{preempted.render_s:.2f} s ({drained} stops drained, items resumed from steps {resumed}; "
                  f"restarts {preempted.restart_s:.1f} s); videos identical: {same}", flush=True)
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"\nload average at the end {load_average()}")
        print("| arm | rendering s | ratio |")
        print("|---|---:|---:|")
        print(f"| plain (no checkpoints) | {med['plain']:.2f} | 1.00 |")
        print(f"| straight (checkpoints every {args.every} steps, never stopped) | {med['straight']:.2f} | "
              f"{med['straight/plain']:.3f} |")
        print(f"| preempted {STOPS} times (restarts {med['restart']:.1f} s apart) | {med['preempted']:.2f} | "
              f"{med['preempted/plain']:.3f} (/ straight {med['preempted/straight']:.3f}) |")
        per_stop = (med["preempted"] - med["straight"]) / STOPS
        print(f"\nper stop {per_stop:.2f} s of rendering (a new process's first call, the step in flight, one save)")
        # A step's time is plain's rendering less the short arm's, per step: at few steps under load the
        # difference can be noise below zero, which is no step time (then said so, not printed as one).
        step = (f"one step {med['step_ms']:.2f} ms; one checkpoint written {med['write_ms']:.2f} ms = "
                f"{med['write/step']:.2f} steps" if med["step_ms"] > 0 else
                f"one step not measured (the short arm took as long as plain: too few steps to tell); one checkpoint "
                f"written {med['write_ms']:.2f} ms")
        print(f"{step}; items resumed per preempted run: {med['resumed']:.0f}")
        verdict = "within" if med["preempted/straight"] <= 1.1 else "NOT within"
        print(f"preempted / straight {med['preempted/straight']:.3f}: {verdict} 1.1x; every item identical")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
