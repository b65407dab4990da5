#!/usr/bin/env python3
"""A whole DiffusionJob over a 1,000,000-row data set: the reading path's peak memory, the first item.

    ~/.cache/muralist/venv/bin/python benchmarks/dataset_job.py [--rows 1000000] [--render 10] [--rounds 3]
        [--quick]

Builds, in a temp dir, one prompt per row (~200 bytes each: a caption with its subject, place,
light and camera, the row number in it) with seed N, as JSON Lines and as Parquet written with
64 Ki-row groups (and, for comparison, with pyarrow's default: 1 Mi rows per group, i.e. the
whole file is one group), plus a 10-row copy of each. Then runs, as `muralist run JOB.yaml
--dataset-dir DIR` would (the same manifest reader, RuntimeSpec and agent command; see
`run_job`), a DiffusionJob with `spec.dataset` pointing at the file: muralist/tiny-flux at
32x32, 2 steps, DataParallel with 1 process, rendering only the last `--render` rows
(`dataset.start`/`end`), so that what a big data set costs beyond the 10-row job is planning
and reading (the row count, the seek to `start`), not rendering. The 10-row job renders its
10 rows: the same number of items.

Figures:
- the reading path's own peak: a rank's peak (VmHWM) is the interpreter, torch, diffusers and
  the model, ~900 MiB, under which a few MiB of reading disappear; so after each job a fresh
  child process, without torch, does only what a rank does with the rows (open and count the
  source, make the work plan, read the range's first row, then every chunk's rows) with the
  job's RuntimeSpec, and reports its own VmHWM (and its VmHWM after its imports, before the
  source is opened), with perf_counter around both parts. Its peak over the 10-row job's child
  is what the big data set costs the reading path;
- first item: from the launcher's start (just before the agent process is started: interpreter
  start, imports, model load, planning, reading, one render and its write) to the first output
  file's modification time; its difference from the 10-row job per round;
- beside them, the rank's own peakMemoryMiB (its termination message) and the wall time.
Rounds interleave the cases so drift in the machine's load hits all of them alike.

Targets (issue 15): peak memory growth < 200 MB, first item < 10 s.

Parquet row groups of 64 Ki rows: a Parquet reader decodes a column chunk (a row group's worth
of a column) at a time. pyarrow's `write_table` puts up to 1 Mi rows in a group, so a
1,000,000-row file is one group and reading any row decodes the whole prompt column (every
prompt of the data set) at once; with 64 Ki-row groups a rank decodes only the group holding
its rows, and seeking to a chunk near the end skips the groups before it using the footer's row
counts, without decoding them. The `parquet (pyarrow default: 1 group)` case measures the
difference.

--quick: 5,000 rows of JSON Lines only, the last 2 rendered, 1 round (about 20 s; the test
suite runs it to check that the table prints).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

GROWTH_TARGET_MB = 200
FIRST_ITEM_TARGET_S = 10.0
MIB = 1024 * 1024
MB = 1_000_000

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) muralist: (.*)$")


# --------------------------------------------------------------------------- running a job
# Shared with straggler.py.


def bench_env() -> dict[str, str]:
    # torchrun sets OMP_NUM_THREADS=1 per worker only when it starts several; pin it always.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error",
            "PYTHONUNBUFFERED": "1"}


@dataclass
class JobRun:
    """One run of a job: its agents' exit codes, logs, termination messages, wall time."""

    name: str
    output: Path
    codes: list[int]
    wall_s: float
    logs: list[str]  # stdout + stderr of each agent (its workers' too)
    terminations: list[dict[str, Any]]  # one per agent (pod)
    commands: list[str] = field(default_factory=list)
    started_at: float = 0.0  # epoch seconds just before the first agent process was started

    def first_item_s(self) -> float:
        """Launcher start -> the first output file on disk (its modification time): the whole
        path a user waits through, interpreter start and imports included."""
        files = [p for p in (self.output / "images").glob("*") if p.is_file()]
        if not files:
            raise SystemExit(f"{self.name}: no output files")
        return min(p.stat().st_mtime for p in files) - self.started_at

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)

    def manifest(self) -> list[dict[str, Any]]:
        path = self.output / "manifest.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def log_lines(self) -> list[tuple[float, str]]:
        """(epoch seconds, message) of every `muralist:` log line of every agent."""
        out = []
        for text in self.logs:
            for line in text.splitlines():
                m = LOG_TIME.match(line.strip())
                if m:
                    stamp = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S"))
                    out.append((stamp + int(m.group(1)[20:]) / 1000, m.group(2)))
        return out

    def failure(self) -> str:
        tail = "\n".join(t[-3000:] for t in self.logs)
        return f"{self.name}: exit codes {self.codes}; termination {self.terminations}\n{tail}"


def run_job(manifest: dict[str, Any], work: Path, name: str, extra_env: dict[str, str] | None = None,
            dataset_dir: Path | None = None, timeout: float = 900) -> JobRun:
    """Run `manifest` as `muralist run FILE --output OUT [--dataset-dir DIR]` does: the same
    reader (local.load_job), RuntimeSpec (local.runtime_spec) and one agent per pod of the spec
    (local.agent_commands: the pod contract's command), started together on this machine.
    Unlike `muralist run`, each agent gets its own termination-log file, kept (as each pod's
    /dev/termination-log is its own), and no progress bar runs."""
    from muralist_api import contract
    from muralist_runtime import local

    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    out = work / name
    job, _ = local.load_job(str(path))
    runtime = local.runtime_spec(job, str(out), None, None, str(dataset_dir) if dataset_dir else None)
    out.mkdir(parents=True, exist_ok=True)
    spec_file = work / f"{name}.spec.json"
    spec_file.write_text(runtime.model_dump_json(by_alias=True, exclude_none=True))
    nodes = runtime.spec.parallelism.nodes
    env = {**bench_env(), **(extra_env or {}), contract.MURALIST_LOCAL: "1"}
    procs, logs, terms, commands = [], [], [], []
    started_at, start = time.time(), time.perf_counter()
    agents = local.agent_commands(runtime, str(spec_file), *local.local_ports(nodes))
    for node, (argv, agent_env) in enumerate(agents):
        term = work / f"{name}.termination-{node}"
        term.unlink(missing_ok=True)
        log = work / f"{name}.log-{node}"
        penv = {**env, **agent_env, contract.MURALIST_TERMINATION_LOG: str(term),
                contract.MURALIST_PROGRESS_DIR: str(work / f"{name}.progress-{node}")}
        with open(log, "wb") as f:
            procs.append(subprocess.Popen(argv, env=penv, stdout=f, stderr=subprocess.STDOUT))
        logs.append(log)
        terms.append(term)
        commands.append(" ".join(f"{k}={v}" for k, v in agent_env.items()) + " " + " ".join(argv))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, timeout - (time.perf_counter() - start))))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    wall = time.perf_counter() - start

    def termination(p: Path) -> dict[str, Any]:
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return {}

    return JobRun(name, out, codes, wall, [p.read_text(errors="replace") for p in logs],
                  [termination(t) for t in terms], commands, started_at)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def warm_up(work: Path) -> None:
    """One small unmeasured job: builds muralist/tiny-flux into the cache if needed, warms the
    page cache (torch, diffusers) so that round 1 is not the only cold one."""
    manifest = job_manifest("warm-up", None, ["a warm-up prompt"], steps=2, processes=1)
    run = run_job(manifest, work, "warm-up")
    if not run.ok:
        raise SystemExit(run.failure())


def job_manifest(name: str, dataset: dict[str, Any] | None, prompts: list[str] | None = None, *,
                 steps: int = 2, processes: int = 1, nodes: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "muralist/tiny-flux"},
        "generation": {"steps": steps, "height": 32, "width": 32, "seed": 0,
                       "extraArgs": {"max_sequence_length": 16}},
        "parallelism": {"strategy": "DataParallel", "nodes": nodes, "gpusPerNode": 0,
                        "processesPerNode": processes},
        # Several pods share one output (muralist run writes it to a local folder; the volume is what a cluster
        # would mount: the per-pod default emptyDir is refused).
        "output": {"format": "png", **({"volume": {"persistentVolumeClaim": {"claimName": "results"}}}
                                       if nodes > 1 else {})},
    }
    if dataset is not None:
        spec["dataset"] = dataset
    else:
        spec["prompts"] = prompts
    return {"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob", "metadata": {"name": name},
            "spec": spec}


# --------------------------------------------------------------------------- the data sets

SUBJECTS = ("an old lighthouse", "a red fox", "a wooden sailing boat", "a stone bridge", "a tram", "an owl",
            "a windmill", "a greenhouse", "a market stall", "a mountain hut", "a vintage robot")
PLACES = ("on a rocky coast", "in a snowy birch forest", "in a harbour at dawn", "over a slow river",
          "on a rainy city street", "in a quiet library", "beside a lavender field")
LIGHTS = ("in soft golden evening light", "under a heavy grey overcast sky", "lit by neon signs at night",
          "in pale winter morning sun", "in warm lamplight")
PROMPT_BYTES = 200


def prompt_text(i: int) -> str:
    """A ~200-byte caption (the length of a typical captioned data set's prompts), row number included."""
    text = (f"photo {i}: {SUBJECTS[i % len(SUBJECTS)]} {PLACES[i % len(PLACES)]} {LIGHTS[i % len(LIGHTS)]}, shot "
            f"on a 35 mm film camera with a wide lens, shallow depth of field, fine grain, muted natural colours, "
            f"careful composition, highly detailed")
    return text[:PROMPT_BYTES]


def build(directory: Path, rows: int, sources: list[str]) -> dict[str, str]:
    """The data set files (names relative to `directory`, the stand-in for the volume)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    if "jsonl" in sources:
        with open(directory / "prompts.jsonl", "w") as f:
            for i in range(rows):
                f.write(json.dumps({"prompt": prompt_text(i), "seed": i}) + "\n")
        files["jsonl"] = "prompts.jsonl"
    if any(s.startswith("parquet") for s in sources):
        table = pa.table({"prompt": [prompt_text(i) for i in range(rows)], "seed": pa.array(range(rows))})
        if PARQUET_64KI in sources:
            pq.write_table(table, directory / "groups-64ki.parquet", row_group_size=64 * 1024)
            files[PARQUET_64KI] = "groups-64ki.parquet"
        if PARQUET_ONE in sources:
            pq.write_table(table, directory / "default-groups.parquet")
            files[PARQUET_ONE] = "default-groups.parquet"
    return files


PARQUET_64KI = "parquet (64 Ki-row groups)"
PARQUET_ONE = "parquet (pyarrow default: 1 group)"
SOURCES = ["jsonl", PARQUET_64KI, PARQUET_ONE]


def dataset_block(path: str, start: int, end: int) -> dict[str, Any]:
    return {"volume": {"persistentVolumeClaim": {"claimName": "bench-prompts", "readOnly": True}},
            "path": path, "columns": {"prompt": "prompt", "seed": "seed"}, "start": start, "end": end}


@dataclass
class Case:
    source: str  # a key of build()'s result
    rows: int
    directory: Path
    file: str
    start: int
    end: int
    rank_peak_mib: list[float] = field(default_factory=list)  # the rank's VmHWM (model included)
    first_s: list[float] = field(default_factory=list)  # launcher start -> first output file
    wall_s: list[float] = field(default_factory=list)
    read_peak_mib: list[float] = field(default_factory=list)  # the reading child's VmHWM
    read_base_mib: list[float] = field(default_factory=list)  # its VmHWM after imports, before reading
    plan_s: list[float] = field(default_factory=list)  # the child: open, count, plan, first row
    read_s: list[float] = field(default_factory=list)  # the child: every chunk's rows after that

    @property
    def slug(self) -> str:
        return f"{Path(self.file).stem}-{self.rows}"


def check_outputs(run: JobRun, case: Case) -> None:
    """Every row of the range rendered once, with the seed of its row (the seed column)."""
    entries = run.manifest()
    got = sorted((e["index"], e["seed"], e["status"]) for e in entries)
    want = [(i, i, "rendered") for i in range(case.start, case.end)]
    if got != want:
        raise SystemExit(f"{case.slug}: manifest rows/seeds/status {got[:5]}... != {want[:5]}... "
                         f"({len(got)} entries, expected {len(want)})")
    images = sorted((run.output / "images").glob("*.png"))
    if len(images) != len(want):
        raise SystemExit(f"{case.slug}: {len(images)} images, expected {len(want)}")


def peak_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def read_child(spec_file: str) -> None:
    """What a rank does with the rows, alone, in a process of its own: check_spec's part (open the
    source and count it, make the work plan, read the first row of the range) and then every
    chunk's rows as render/claim_loop.py reads them. Prints a JSON line: seconds, and VmHWM after
    the imports and at the end (this process's peak: the reading path's own)."""
    import pyarrow.parquet  # noqa: F401 - a rank has it loaded before it plans
    from muralist_api.runtime_spec import RuntimeSpec
    from muralist_runtime.work import chunks, rows

    runtime = RuntimeSpec.model_validate_json(Path(spec_file).read_text())
    base = peak_rss_kb()
    t0 = time.perf_counter()
    source = rows.open_rows(runtime)
    plan = chunks.make_plan(runtime.spec, source.count(), source.start)
    first = rows.items_of(source.rows(source.start, source.start + 1), runtime.spec.generation)[0]
    t_plan = time.perf_counter() - t0
    n = 0
    for chunk in range(plan.chunks):
        n += len(rows.items_of(source.rows(*plan.bounds(chunk)), runtime.spec.generation))
    t_all = time.perf_counter() - t0
    assert n == plan.total_items and first.row == source.start and first.seed == source.start, (n, plan, first)
    print(json.dumps({"plan_s": t_plan, "read_s": t_all - t_plan, "base_mib": base / 1024,
                      "peak_mib": peak_rss_kb() / 1024}))


def run_read_child(spec_file: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--read-child", str(spec_file)], capture_output=True,
                         text=True, env=bench_env(), timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"reading child failed on {spec_file}:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


QUICK = {"rows": 5_000, "render": 2, "rounds": 1, "sources": ["jsonl"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--render", type=int, default=10, help="rows rendered: the last N of the big data set")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sources", nargs="+", default=SOURCES, choices=SOURCES)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK}")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (data sets, outputs, logs)")
    parser.add_argument("--read-child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_child:
        read_child(args.read_child)
        return 0
    if args.quick:
        vars(args).update(QUICK)

    work = Path(tempfile.mkdtemp(prefix="muralist-bench-dataset-"))
    try:
        t = time.perf_counter()
        big, small = work / "big", work / "small"
        files = build(big, args.rows, args.sources)
        build(small, 10, args.sources)
        sizes = ", ".join(f"{k} {(big / v).stat().st_size / MB:.0f} MB" for k, v in files.items())
        print(f"built {args.rows:,} + 10 rows ({sum(len(prompt_text(i)) for i in range(100)) / 100:.0f}-byte "
              f"prompts) in {time.perf_counter() - t:.1f} s: {sizes}", flush=True)
        n = min(args.render, 10)
        cases: list[Case] = []
        for source, file in files.items():
            cases.append(Case(source, args.rows, big, file, args.rows - n, args.rows))
            if source != PARQUET_ONE:  # 10 rows are one group either way
                cases.append(Case(source, 10, small, file, 10 - n, 10))
        baseline = {c.source: c for c in cases if c.rows == 10}
        if PARQUET_ONE in files:
            baseline[PARQUET_ONE] = baseline[PARQUET_64KI]
        if not args.quick:
            warm_up(work)
        loads = [load_average()]
        print(f"load average {loads[0]}", flush=True)
        for rnd in range(args.rounds):
            for case in cases:
                name = f"r{rnd}-{case.slug}"
                manifest = job_manifest(name, dataset_block(case.file, case.start, case.end))
                run = run_job(manifest, work, name, dataset_dir=case.directory)
                if not run.ok:
                    raise SystemExit(run.failure())
                check_outputs(run, case)
                term = run.terminations[0]
                case.rank_peak_mib.append(term["peakMemoryMiB"])
                case.first_s.append(run.first_item_s())
                case.wall_s.append(run.wall_s)
                alone = run_read_child(work / f"{name}.spec.json")
                case.plan_s.append(alone["plan_s"])
                case.read_s.append(alone["read_s"])
                case.read_peak_mib.append(alone["peak_mib"])
                case.read_base_mib.append(alone["base_mib"])
                print(f"round {rnd + 1} {case.source:36s} {case.rows:>9,} rows: first item {case.first_s[-1]:.2f} s "
                      f"from launch (the rank's own firstItemSeconds {term['firstItemSeconds']:.2f}), rank peak "
                      f"{term['peakMemoryMiB']:.0f} MiB, wall {run.wall_s:.1f} s; reading alone: peak "
                      f"{alone['peak_mib']:.1f} MiB (after imports {alone['base_mib']:.1f}), plan "
                      f"{alone['plan_s']:.3f} s, read {alone['read_s']:.3f} s; load {load_average()}", flush=True)
                if rnd == 0 and case is cases[0]:
                    print(f"  agent command: {run.commands[0]}", flush=True)
            loads.append(load_average())
        met = report(cases, baseline, args, loads)
        return 0 if met or args.quick else 1  # a quick run checks that it runs, not the targets
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


def report(cases: list[Case], baseline: dict[str, Case], args: argparse.Namespace, loads: list[str]) -> bool:
    med = statistics.median
    print(f"\n{args.rows:,}-row data sets vs 10-row ones, {PROMPT_BYTES}-byte prompts; rows rendered: the last "
          f"{min(args.render, 10)} of each; muralist/tiny-flux 32x32, 2 steps, 1 process; median of {args.rounds} "
          f"round(s) (load average before/after each round: {' | '.join(loads)})\n")
    print("| source | rows | reading path: peak MiB (after imports) | reading peak over 10-row's (MB) | "
          "reading: open+count+plan+first row s | reading: the range s | first item from launch s (min-max) | "
          "first item - 10-row's s (per round) | rank peak MiB (model included) | wall s |")
    print("|---|---:|---:|---:|---:|---:|---|---|---:|---:|")
    ok = True
    for c in cases:
        base = baseline[c.source]
        big = c.rows != 10
        growth_mb = (med(c.read_peak_mib) - med(base.read_peak_mib)) * MIB / MB
        diffs = [a - b for a, b in zip(c.first_s, base.first_s, strict=True)]
        first = f"{med(diffs):+.2f} ({', '.join(f'{d:+.2f}' for d in diffs)})" if big else "-"
        print(f"| {c.source} | {c.rows:,} | {med(c.read_peak_mib):.1f} ({med(c.read_base_mib):.1f}) | "
              f"{f'{growth_mb:+.1f}' if big else '-'} | {med(c.plan_s):.3f} | {med(c.read_s):.3f} | "
              f"{med(c.first_s):.2f} ({min(c.first_s):.2f}-{max(c.first_s):.2f}) | {first} | "
              f"{med(c.rank_peak_mib):.0f} | {med(c.wall_s):.1f} |")
        if big:
            ok &= growth_mb < GROWTH_TARGET_MB and med(c.first_s) < FIRST_ITEM_TARGET_S
    print(f"\ntargets (the reading path's peak over the 10-row job's < {GROWTH_TARGET_MB} MB, first item from "
          f"launch < {FIRST_ITEM_TARGET_S:g} s, medians): {'met' if ok else 'MISSED'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
