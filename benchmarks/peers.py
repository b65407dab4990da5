#!/usr/bin/env python3
"""What a user would run instead of `muralist run`, side by side: the same Parquet of prompts, the same
pipeline and seeds, on this machine's two cores.

    ~/.cache/muralist/venv/bin/python benchmarks/peers.py [--items 800] [--rounds 3]
        [--variants bare recipe ray muralist compile-cold compile-warm ...] [--ray-python PYTHON] [--quick]

The model is the trained `muralist/tiny-shapes-flux` (it ships in the runtime package) at what it was trained
for: 64x64, 8 steps, 8 text tokens, float32; item i is row i of the Parquet (captions of the shapes world) with
seed i (the runtime's determinism rule: base seed 0, one image per prompt). Each variant runs 2 processes x 1
thread (OMP_NUM_THREADS=1; torchrun sets the same):

- bare: two plain processes calling the pipeline, each on its contiguous half, one call per item, no output
  but a digest of each image's pixels, written at the end (the limit: what the hardware does with no I/O);
- recipe: the seeds' data-parallel recipe from diffusers' docs: `accelerate launch --multi_gpu
  --num_processes 2` with `PartialState.split_between_processes`, a call and a PNG save per item;
- ray: Ray Data, `read_parquet` -> `map_batches` with 2 actors of 1 CPU each (a pipeline per actor, a call
  and a PNG save per row), `ray.init(num_cpus=4)` (with 2 the read tasks wait forever for a CPU the actors
  hold); it runs in a venv with ray (`--ray-python`, made by `--make-ray-venv`);
- muralist: `muralist run` of a DiffusionJob reading the Parquet (`spec.dataset`), DataParallel, 2 processes;
- compile-cold / compile-warm: the same with `generation.compile: true`, first with an empty compile cache
  (the model cache, HF_HOME, is a fresh folder), then with the cache the cold run wrote; each run's
  inductor folder (TORCHINDUCTOR_CACHE_DIR) is fresh, as a new pod's is, so only Muralist's compile cache
  can make a run warm;
- muralist-no-zygote (only when named): `muralist run` whose ranks start the ordinary way, importing torch and
  diffusers after the launcher's rendezvous, not forked from the zygote a CPU pod starts (MURALIST_ZYGOTE=off);
- muralist-bs4, compile-cold-bs4, compile-warm-bs4: the same three with `generation.batchSize: 4` (four prompts
  per call; a batch size is a size of its own in the compile cache, so compile-cold-bs4 finds no entry for it).

Every figure is end to end: items / wall time of the whole command (imports, process start, rendezvous,
loading, compiling, rendering, writing, and the runtime's merge and gallery), as a user waits for it. Rounds
interleave the variants so that drift in the machine's load hits each alike; the table gives the median
round. Images: every variant's pixels are compared with the bare processes' (a SHA-256 of each image's
RGB bytes): identical where compile is off at batch size 1; with compile or another batch size, how many are
identical and the largest and mean difference in 8-bit levels from muralist's (uncompiled, batch size 1).

--quick: 16 items, 1 round, bare and muralist (the test suite runs it to check that the table prints).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
MODEL = "muralist/tiny-shapes-flux"
SIZE, STEPS, TOKENS, GUIDANCE = 64, 8, 8, 3.5
PROCESSES = 2
RAY_VERSION = "2.60.0"  # what --make-ray-venv installs
RAY_VENV = Path(os.environ.get("MURALIST_CACHE", Path.home() / ".cache/muralist")) / "peers-ray-venv"
VARIANTS = ("bare", "recipe", "ray", "muralist", "compile-cold", "compile-warm", "muralist-bs4", "compile-cold-bs4",
            "compile-warm-bs4", "muralist-no-zygote")
DEFAULT_VARIANTS = VARIANTS[:-1]
QUICK_VARIANTS = ("bare", "muralist")


# --------------------------------------------------------------------------- the work, shared by every peer


def captions(n: int) -> list[str]:
    from muralist_runtime.model.shapes import all_attributes

    every = [a.caption() for a in all_attributes()]
    return [every[i % len(every)] for i in range(n)]


def write_prompts(path: Path, n: int) -> None:
    """The Parquet every peer reads: a caption and a seed per row (seed i for row i: the runtime's rule)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": captions(n), "seed": list(range(n))}), path)


def read_prompts(path: str) -> list[tuple[str, int]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["prompt", "seed"])
    return list(zip(table.column("prompt").to_pylist(), table.column("seed").to_pylist(), strict=True))


def model_dir() -> str:
    from muralist_runtime.model.bundled import bundled_model

    return str(bundled_model(MODEL))


def load_pipeline() -> Any:
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(model_dir(), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def render(pipe: Any, prompt: str, seed: int) -> Any:
    """One item, as every peer calls it: the runtime's seeds (seed i for row i), one CPU generator."""
    import torch

    return pipe(prompt, num_inference_steps=STEPS, guidance_scale=GUIDANCE, height=SIZE, width=SIZE,
                max_sequence_length=TOKENS, generator=torch.Generator("cpu").manual_seed(seed)).images[0]


def key(row: int) -> str:
    return f"{row:05d}-000"  # the runtime's file names


def pixels_digest(image: Any) -> str:
    return hashlib.sha256(image.convert("RGB").tobytes()).hexdigest()


# --------------------------------------------------------------------------- the peers' own processes


def bare_worker(args: argparse.Namespace) -> int:
    """One of the two bare processes: its contiguous half, a call per item, digests at the end."""
    prompts = read_prompts(args.prompts)
    pipe = load_pipeline()
    per = -(-len(prompts) // args.world)
    rows = range(args.rank * per, min(len(prompts), (args.rank + 1) * per))
    digests = {key(r): pixels_digest(render(pipe, *prompts[r])) for r in rows}
    Path(args.output, f"digests-{args.rank}.json").write_text(json.dumps(digests))
    return 0


def recipe_worker(args: argparse.Namespace) -> int:
    """The seeds' DP recipe under accelerate: split_between_processes, a call and a save per item."""
    from accelerate import PartialState

    prompts = read_prompts(args.prompts)
    # On a CPU box `--multi_gpu` starts the processes and PartialState(cpu=True) joins them with gloo.
    state = PartialState(cpu=True)
    pipe = load_pipeline()
    out = Path(args.output)
    with state.split_between_processes(list(range(len(prompts)))) as rows:
        for r in rows:
            render(pipe, *prompts[r]).save(out / f"{key(r)}.png")
    state.wait_for_everyone()
    return 0


def ray_driver(args: argparse.Namespace) -> int:
    """Ray Data as a data engineer would write it: read_parquet, map_batches over 2 actors of 1 CPU each."""
    import ray

    out = args.output

    class Renderer:
        def __init__(self) -> None:
            import torch

            torch.set_num_threads(1)
            self.pipe = load_pipeline()

        def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
            for prompt, seed in zip(batch["prompt"], batch["seed"], strict=True):
                render(self.pipe, str(prompt), int(seed)).save(f"{out}/{key(int(seed))}.png")
            return {"seed": batch["seed"]}

    # With num_cpus=2 the read tasks wait forever for a CPU the two actors hold (seen here with Ray 2.60).
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    rendered = ray.data.read_parquet(args.prompts).map_batches(Renderer, concurrency=PROCESSES, num_cpus=1,
                                                               batch_size=16).count()
    ray.shutdown()
    return 0 if rendered == len(read_prompts(args.prompts)) else 1


# --------------------------------------------------------------------------- variants, timed from here


def bench_env(**more: str) -> dict[str, str]:
    env = dict(os.environ)
    # torchrun sets OMP_NUM_THREADS=1 per worker when it starts several: every peer gets the same.
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error"})
    env.update(more)
    return env


def run(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout.decode(errors="replace")[-4000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return wall


def run_bare(prompts: Path, out: Path) -> float:
    out.mkdir(parents=True)
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "bare-worker", "--prompts",
                               str(prompts), "--output", str(out), "--rank", str(r), "--world", str(PROCESSES)],
                              env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(PROCESSES)]
    outputs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - start
    for p, text in zip(procs, outputs, strict=True):
        if p.returncode != 0:
            sys.stderr.write(text.decode(errors="replace")[-4000:])
            raise SystemExit(f"a bare process failed ({p.returncode})")
    return wall


def run_recipe(prompts: Path, out: Path) -> float:
    from muralist_runtime.local import free_port_range

    out.mkdir(parents=True)
    cmd = [str(VENV_BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(PROCESSES),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port_range(1)), str(Path(__file__).resolve()), "recipe-worker",
           "--prompts", str(prompts), "--output", str(out)]
    return run(cmd, bench_env())


def run_ray(prompts: Path, out: Path, python: str) -> float:
    out.mkdir(parents=True)
    cmd = [python, str(Path(__file__).resolve()), "ray-driver", "--prompts", str(prompts), "--output", str(out)]
    here = os.pathsep.join(str(HERE.parent / d) for d in ("api", "runtime", "cli"))
    return run(cmd, bench_env(PYTHONPATH=here))


def manifest(prompts: Path, compile_: bool, batch_size: int) -> dict[str, Any]:
    return {
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": "peers"},
        "spec": {
            "model": {"name": MODEL, "dtype": "float32"},
            "dataset": {"volume": {"hostPath": {"path": str(prompts.parent)}}, "path": prompts.name,
                        "format": "parquet", "columns": {"prompt": "prompt", "seed": "seed"}},
            "generation": {"steps": STEPS, "guidanceScale": GUIDANCE, "height": SIZE, "width": SIZE, "seed": 0,
                           "batchSize": batch_size, "compile": compile_,
                           "extraArgs": {"max_sequence_length": TOKENS}},
            "parallelism": {"strategy": "DataParallel", "nodes": 1, "gpusPerNode": 0,
                            "processesPerNode": PROCESSES},
            "output": {"format": "png"},
        },
    }


def compile_bytecode() -> None:
    """Muralist's bytecode, as an installed image has it (pip compiles what it installs): an editable checkout
    under PYTHONDONTWRITEBYTECODE=1 (this machine's setting) would compile its modules again in every run, 0.2 s
    of a run measured, where the peers import only installed libraries."""
    import compileall
    import importlib.util

    for package in ("muralist_api", "muralist_runtime", "muralist_cli", "muralist"):
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(folder, quiet=1)


def run_muralist(prompts: Path, out: Path, work: Path, hf_home: Path, compile_: bool, batch_size: int,
                 zygote: bool = True) -> float:
    import yaml

    job = work / f"{out.name}.yaml"
    job.write_text(yaml.safe_dump(manifest(prompts, compile_, batch_size), sort_keys=False))
    inductor = Path(tempfile.mkdtemp(prefix="inductor-", dir=work))  # a new pod's: empty
    env = bench_env(HF_HOME=str(hf_home), TORCHINDUCTOR_CACHE_DIR=str(inductor),
                    **({} if zygote else {"MURALIST_ZYGOTE": "off"}))
    wall = run([str(VENV_BIN / "muralist"), "run", str(job), "--output", str(out)], env)
    shutil.rmtree(inductor, ignore_errors=True)
    return wall


# --------------------------------------------------------------------------- images and the table


def digests_of(folder: Path) -> dict[str, str]:
    found = {}
    for f in folder.glob("digests-*.json"):
        found.update(json.loads(f.read_text()))
    if found:
        return found
    from PIL import Image

    pngs = sorted(folder.glob("*.png")) or sorted((folder / "images").glob("*.png"))
    return {p.stem: pixels_digest(Image.open(p)) for p in pngs}


def pixel_difference(reference: Path, folder: Path) -> tuple[float, float]:
    """(max, mean) difference in 8-bit levels of a variant's PNGs against a folder of the same items."""
    import numpy as np
    from PIL import Image

    worst, means = 0.0, []
    for p in sorted((folder / "images").glob("*.png")):
        a = np.asarray(Image.open(reference / p.name).convert("RGB"), dtype=np.int16)
        b = np.asarray(Image.open(p).convert("RGB"), dtype=np.int16)
        diff = np.abs(a - b)
        worst, means = max(worst, float(diff.max())), [*means, float(diff.mean())]
    return worst, statistics.fmean(means) if means else 0.0


@dataclass
class Variant:
    name: str
    walls: list[float] = field(default_factory=list)
    images: str = ""

    def rate(self, items: int) -> float:
        return items / statistics.median(self.walls)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def make_ray_venv(target: Path) -> str:
    """A venv of its own for Ray Data (never the test venv): this venv's packages through a .pth, and ray."""
    python = target / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        # addsitedir, not a bare path: the test venv's own .pth files (its editable install) count too.
        Path(site, "muralist-venv.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"ray[data]=={RAY_VERSION}"], check=True)
    return str(python)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    for name in ("bare-worker", "recipe-worker", "ray-driver"):
        worker = sub.add_parser(name)
        worker.add_argument("--prompts", required=True)
        worker.add_argument("--output", required=True)
        worker.add_argument("--rank", type=int, default=0)
        worker.add_argument("--world", type=int, default=PROCESSES)
    parser.add_argument("--items", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(DEFAULT_VARIANTS))
    parser.add_argument("--ray-python", default=str(RAY_VENV / "bin" / "python"),
                        help="a Python with ray[data] and this venv's packages (default: --make-ray-venv's)")
    parser.add_argument("--make-ray-venv", action="store_true", help=f"make {RAY_VENV} (ray[data]=={RAY_VERSION})")
    parser.add_argument("--keep", action="store_true", help="keep the outputs")
    parser.add_argument("--quick", action="store_true", help="16 items, 1 round, bare and muralist")
    args = parser.parse_args()
    if args.command == "bare-worker":
        return bare_worker(args)
    if args.command == "recipe-worker":
        return recipe_worker(args)
    if args.command == "ray-driver":
        return ray_driver(args)
    if args.make_ray_venv:
        args.ray_python = make_ray_venv(RAY_VENV)
    if args.quick:
        args.items, args.rounds, args.variants = 16, 1, list(QUICK_VARIANTS)
    if "ray" in args.variants and not Path(args.ray_python).exists():
        raise SystemExit(f"no {args.ray_python}: pass --make-ray-venv (or --ray-python), or leave out the ray variant")
    return bench(args)


def bench(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="muralist-peers-"))
    prompts = work / "data" / "prompts.parquet"
    prompts.parent.mkdir()
    write_prompts(prompts, args.items)
    compile_bytecode()
    variants = {name: Variant(name) for name in args.variants}
    loads = [load_average()]
    command = " ".join(["benchmarks/peers.py", *sys.argv[1:]])
    print(f"{MODEL}: {args.items} items of {SIZE}x{SIZE}, {STEPS} steps, {PROCESSES} processes x 1 thread, "
          f"{args.rounds} round(s); load average {loads[0]}", flush=True)
    try:
        for rnd in range(args.rounds):
            hf_home = work / f"hf-{rnd}"  # the model cache: compile-cold finds it empty, compile-warm filled
            for v in variants.values():
                out = work / f"r{rnd}-{v.name}"
                if v.name == "bare":
                    wall = run_bare(prompts, out)
                elif v.name == "recipe":
                    wall = run_recipe(prompts, out)
                elif v.name == "ray":
                    wall = run_ray(prompts, out, args.ray_python)
                else:
                    compile_ = v.name.startswith("compile")
                    if v.name == "compile-cold":
                        shutil.rmtree(hf_home, ignore_errors=True)
                    wall = run_muralist(prompts, out, work, hf_home, compile_, 4 if v.name.endswith("bs4") else 1,
                                        zygote=v.name != "muralist-no-zygote")
                v.walls.append(wall)
                print(f"round {rnd + 1} {v.name:18s} {wall:7.2f}s  {args.items / wall:6.2f} items/s  "
                      f"load {load_average()}", flush=True)
            loads.append(load_average())
        check_images(work, variants, args.items)
        report(variants, args, loads, command)
    finally:
        if args.keep:
            print(f"outputs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def check_images(work: Path, variants: dict[str, Variant], items: int) -> None:
    """Round 1's images of each variant against the bare processes' (or, without those, muralist's)."""
    base_name = "bare" if "bare" in variants else next(iter(variants))
    base = digests_of(work / f"r0-{base_name}")
    for v in variants.values():
        folder = work / f"r0-{v.name}"
        found = digests_of(folder)
        if len(found) != items:
            raise SystemExit(f"{v.name}: {len(found)} images, expected {items}")
        if v.name == base_name:
            v.images = "the reference"
        elif found == base:
            v.images = "identical"
        elif (work / "r0-muralist" / "images").exists():  # compiled, or another batch size: how far from bs 1
            worst, mean = pixel_difference(work / "r0-muralist" / "images", folder)
            same = sum(found[k] == base.get(k) for k in found)
            v.images = f"{same}/{items} identical; max {worst:.0f}, mean {mean:.4f} levels"
        else:
            same = sum(found[k] == base.get(k) for k in found)
            v.images = f"DIFFERENT: {same}/{items} identical"


def report(variants: dict[str, Variant], args: argparse.Namespace, loads: list[str], command: str) -> None:
    items = args.items
    limit = variants["bare"].rate(items) if "bare" in variants else None
    recipe = variants["recipe"].rate(items) if "recipe" in variants else None
    ray = variants["ray"].rate(items) if "ray" in variants else None
    print(f"\n`{command}`: {MODEL}, {items} items of {SIZE}x{SIZE}, {STEPS} steps, {PROCESSES} processes x 1 thread; "
          f"median of {args.rounds} round(s); load average before/after each round: {' | '.join(loads)}\n")
    print("| variant | wall (median) | items/s | vs the limit | vs the recipe | vs Ray Data | images vs bare |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for v in variants.values():
        rate = v.rate(items)

        def ratio(other: float | None, rate: float = rate) -> str:
            return f"{rate / other:.2f}x" if other else "-"

        print(f"| {v.name} | {statistics.median(v.walls):.1f} s | {rate:.1f} | {ratio(limit)} | {ratio(recipe)} "
              f"| {ratio(ray)} | {v.images} |")


if __name__ == "__main__":
    raise SystemExit(main())
