"""strategy: Auto under `muralist run`, end to end on CPU: a memory budget (--gpu-memory) stands for the
device's; the plan is made before any process starts, its ranks confirm it before loading, and the job
file records it, the layout's estimated peak memory and each rank's measured peak.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE
from muralist_api.planner.facts import read_folder
from muralist_api.planner.known import known_facts

from .conftest import Run, make_job


def muralist_run(tmp_path: Path, spec: dict[str, Any], env: dict[str, str], *options: str,
                 name: str = "auto") -> tuple[subprocess.CompletedProcess[str], Run]:
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob",
                                        "metadata": {"name": name}, "spec": spec}))
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "muralist_cli", "run", str(manifest), "--output", str(out),
                           *options], env=env, capture_output=True, text=True, timeout=240)
    return proc, Run(proc.returncode, proc.stdout, proc.stderr, out)


def auto(job: Any, objective: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = job.obj()
    spec["parallelism"]["strategy"] = "Auto"
    if objective:
        spec["parallelism"]["objective"] = objective
    return spec


def job_file(run: Run) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((run.output / "job.json").read_text())
    return doc


def test_the_tiny_models_are_what_the_planners_catalog_says(tiny_model: Path, tiny_wan: Path) -> None:
    """The operator plans the built-in models from the catalog: its figures must be the built models'."""
    for name, folder in (("muralist/tiny-flux", tiny_model), ("muralist/tiny-wan", tiny_wan)):
        built, known = read_folder(folder), known_facts(name)
        assert known is not None
        assert sorted((c.name, c.class_name, c.parameters) for c in built.components) == \
            sorted((c.name, c.class_name, c.parameters) for c in known.components)
        assert (built.heads, built.hidden, built.cp_plan, built.tp_plan) == \
            (known.heads, known.hidden, known.cp_plan, known.tp_plan)


def test_auto_chooses_data_parallel_for_a_model_that_fits(tmp_path: Path, runtime_env: dict[str, str],
                                                          reference: Run) -> None:
    proc, run = muralist_run(tmp_path, auto(make_job().processes(2)), runtime_env, "--gpu-memory", "256MiB")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "strategy Auto (throughput): DataParallel over 2 device(s) per pod" in proc.stderr
    assert run.images() == reference.images()  # the same images as any other layout
    record = job_file(run)
    plan = record["spec"]["parallelPlan"]
    assert record["spec"]["spec"]["parallelism"]["strategy"] == "DataParallel"
    assert plan["reasons"][0].startswith("fits: the whole pipeline on one device") and "256 MiB each" in plan["device"]
    assert plan["modelSource"].startswith("the safetensors headers in ")
    memory = record["memory"]
    assert memory["estimatedPeakMiB"] > 0 and set(memory["estimate"]) == {"weightsMiB", "activationsMiB",
                                                                          "vaeDecodeMiB"}
    # Measured beside it: each rank's own peak (VmHWM on CPU: the interpreter and torch count too).
    assert set(memory["measuredPeakMiB"]) == {"0", "1"} and memory["measuredBy"] == "VmHWM"
    assert all(peak > memory["estimatedPeakMiB"] for peak in memory["measuredPeakMiB"].values())
    gallery = (run.output / "index.html").read_text()
    assert "Auto (throughput): DataParallel over 2 device(s) per pod" in gallery


def test_auto_splits_a_long_video_with_ulysses_for_latency(tmp_path: Path, runtime_env: dict[str, str],
                                                           tiny_wan: Path) -> None:
    # 17 frames at 64 x 64: 5 latent frames x 4 x 4 = 80 tokens, even over 2 ranks; the tiny Wan has 2 heads.
    job = make_job().prompts("a red fox").processes(2)
    job.set("spec.model", {"name": "muralist/tiny-wan", "dtype": "float32"}).output(format="webp")
    job.generation(height=64, width=64, numFrames=17, extraArgs={"max_sequence_length": 16})
    spec = auto(job, "latency")
    spec["parallelism"]["verify"] = True  # the consistency canary: the split item against one rank's
    proc, run = muralist_run(tmp_path, spec, runtime_env, "--gpu-memory", "256MiB", name="video")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "strategy Auto (latency): ContextParallel ulysses 2 x ring 1 over 2 devices" in proc.stderr
    assert "verify (group 0): max 0/255" in proc.stderr  # one item over two ranks, as one rank renders it
    record = job_file(run)
    assert record["spec"]["spec"]["parallelism"]["contextParallel"]["ulyssesDegree"] == 2
    assert record["world"]["groupSize"] == 2
    reasons = record["spec"]["parallelPlan"]["reasons"]
    assert [r.split(":")[0] for r in reasons] == ["fits", "latency"]
    assert "ulysses 2 divides the 2 heads and splits the 80 tokens 40 per rank" in reasons[1]
    assert len(run.manifest()) == 1 and {m["rank"] for m in run.manifest()} == {0}


def test_a_plan_the_pods_measurements_contradict_fails_at_once(tmp_path: Path, runtime_env: dict[str, str],
                                                               tiny_model: Path) -> None:
    # What each rank measures free: less than the tiny model's estimated peak (under 1 MiB).
    env = {**runtime_env, "MURALIST_TEST_DEVICE_MEMORY": "256KiB"}
    start = time.monotonic()
    proc, run = muralist_run(tmp_path, auto(make_job()), env, "--gpu-memory", "256MiB", name="short")
    assert proc.returncode == PERMANENT_FAILURE_EXIT_CODE, proc.stderr[-3000:]
    assert "spec.parallelism: the plan (DataParallel over 1 device(s) per pod) needs an estimated" in proc.stderr
    assert "this pod measured 256 KiB of free memory (MURALIST_TEST_DEVICE_MEMORY)" in proc.stderr
    assert not run.images() and time.monotonic() - start < 120  # before loading, no retries
