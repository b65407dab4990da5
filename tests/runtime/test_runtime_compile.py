"""generation.compile on a CPU under real torchrun: the job renders compiled (the tiny Flux's transformer and its
VAE's decoder precompiled), within the determinism tolerance of the uncompiled images, writes its compile cache
entry; a second run (a new pod: an empty inductor folder) loads the precompiled functions and compiles nothing,
counted in the job file."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from muralist_api import contract
from muralist_runtime.model.canary import MAX_ABS_LEVELS, MEAN_ABS_LEVELS

from .conftest import Run, make_job, runtime_spec_json, torchrun

pytestmark = pytest.mark.torchrun


def compiled_run(tmp_path: Path, name: str, env: dict[str, str], cache: Path) -> Run:
    out = tmp_path / name
    job = make_job().generation(compile=True).obj()
    # A new pod's inductor folder is empty: only the compile cache can make a run warm.
    extra = {contract.MURALIST_COMPILE_CACHE: str(cache), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"{name}-inductor")}
    run = torchrun(runtime_spec_json(job, out), out, env, extra_env=extra, timeout=420)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def compile_record(run: Run) -> dict:
    record = json.loads((run.output / "job.json").read_text())
    assert record["compileSeconds"] > 0
    return record["compile"]


def test_compile_on_cpu_renders_then_a_new_pod_loads_the_cache_and_compiles_nothing(
        tmp_path: Path, runtime_env: dict[str, str], tiny_model: Path, reference: Run) -> None:
    cache = tmp_path / "compile-cache"
    cold = compiled_run(tmp_path, "cold", runtime_env, cache)
    first = compile_record(cold)["byRank"]["0"]
    assert (first["scope"], first["cacheHit"]) == ("whole", False), "the tiny Flux's 2 blocks: whole"
    assert first["precompiled"] == ["decoder", "transformer"], first
    assert first["graphsCompiled"] == 2 and first["kernelsBuilt"] >= 1, "a graph each, at one signature each"
    [entry] = cache.glob("*.tar")  # one entry, written by the rank that compiled
    with tarfile.open(entry) as tar:
        functions = sorted(name.split("-")[0] for name in tar.getnames() if name.startswith("functions/"))
    assert functions == ["functions/decoder", "functions/transformer"], functions

    # Compiled output against the uncompiled images of the same job: within the canary's tolerance.
    assert set(cold.images()) == set(reference.images())
    for name in reference.images():
        key = name.removesuffix(".png")
        diff = abs(cold.pixels(key) - reference.pixels(key))
        assert diff.max() <= MAX_ABS_LEVELS and diff.mean() <= MEAN_ABS_LEVELS, (key, diff.max(), diff.mean())

    warm = compiled_run(tmp_path, "warm", runtime_env, cache)
    again = compile_record(warm)
    assert again["cacheHits"] == again["ranks"] == 1
    assert {k: again["byRank"]["0"][k] for k in ("cacheHit", "graphsCompiled", "kernelsBuilt", "functionsLoaded")} == {
        "cacheHit": True, "graphsCompiled": 0, "kernelsBuilt": 0, "functionsLoaded": 2}, "loaded, nothing compiled"
    assert warm.images() == cold.images(), "the cached kernels render the same bytes"
