"""generation.cache.verify under real torchrun, on the trained muralist/tiny-shapes-flux: a mild
FirstBlockCache passes the gate, an aggressive one fails the job (exit 78, naming the threshold
and the measured value) or, with onFail: DisableCache, turns the cache off for the rest of the job.

On this model (8 steps, 64x64, the 90 unseen seeds of benchmarks/cache_speed.py) FirstBlockCache
0.1 stays at 45.7 dB PSNR and 0.999 SSIM or above against no cache (most images identical), and
0.8 falls to 13.6 dB at worst, 20.1 median (benchmarks/README.md).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from muralist_api import contract
from muralist_runtime.model import bundled, shapes

from tests.runtime.conftest import Run, make_job, runtime_spec_json, torchrun

MILD = {"type": "FirstBlockCache", "options": {"threshold": 0.1}}
AGGRESSIVE = {"type": "FirstBlockCache", "options": {"threshold": 0.8}}
GATE = {"minPsnr": 30, "minSsim": 0.95}


def shapes_job(cache: dict[str, Any], prompts: int = 4, processes: int = 1) -> dict[str, Any]:
    return (make_job().set("spec.model.name", "muralist/tiny-shapes-flux").processes(processes)
            .prompts(*({"text": text, "seed": seed} for text, seed in shapes.evaluation_prompts(prompts)))
            .generation(steps=8, height=shapes.SIZE, width=shapes.SIZE,
                        extraArgs={"max_sequence_length": bundled.SHAPES_TEXT_TOKENS}, cache=cache).obj())


def run_job(tmp_path_factory: pytest.TempPathFactory, runtime_env: dict[str, str], name: str,
            spec: dict[str, Any], processes: int = 1) -> Run:
    out = tmp_path_factory.mktemp(name) / "out"
    return torchrun(runtime_spec_json(spec, out), out, runtime_env, nproc=processes)


def job_json(run: Run) -> dict[str, Any]:
    return json.loads((run.output / "job.json").read_text())


@pytest.fixture(scope="module")
def passed(tmp_path_factory: pytest.TempPathFactory, runtime_env: dict[str, str]) -> Run:
    run = run_job(tmp_path_factory, runtime_env, "gate-pass", shapes_job({**MILD, "verify": {"sample": "50%", **GATE}}))
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_a_mild_cache_passes_and_each_sampled_row_says_what_it_cost(passed: Run) -> None:
    rows = passed.manifest()
    measured = [row for row in rows if "cacheVerify" in row]
    assert [row["index"] for row in measured] == [0, 1], "50% of 4 items: the first two"
    for row in measured:
        verify = row["cacheVerify"]
        assert verify.get("identical") or verify["psnr"] >= GATE["minPsnr"]
        assert GATE["minSsim"] <= verify["ssim"] <= 1
    assert all(row["cache"] == "FirstBlockCache" for row in rows)
    summary = job_json(passed)["cacheVerify"]
    assert summary["verdict"] == "passed" and summary["sampled"] == 2
    assert summary["thresholds"] == GATE
    assert summary["minSsim"] == min(row["cacheVerify"]["ssim"] for row in measured)
    assert passed.termination["cacheVerify"] == {"sampled": 2, "minPsnr": summary["minPsnr"],
                                                 "minSsim": round(summary["minSsim"], 6), "cacheOff": False}
    assert not (passed.output / "cache-off.json").exists()


def test_an_aggressive_cache_fails_the_job_naming_the_threshold_and_the_value(
        tmp_path_factory: pytest.TempPathFactory, runtime_env: dict[str, str]) -> None:
    run = run_job(tmp_path_factory, runtime_env, "gate-fail", shapes_job({**AGGRESSIVE, "verify": GATE}))
    assert run.returncode != 0
    assert run.termination["permanent"] is True
    assert run.termination["exitCode"] == contract.PERMANENT_FAILURE_EXIT_CODE
    message = run.termination["message"]
    assert message.startswith("spec.generation.cache.verify.minPsnr: FirstBlockCache {'threshold': 0.8} costs "
                              "more than the job allows: item "), message
    measured = float(message.split("has PSNR ")[1].split(" dB")[0])
    assert measured < GATE["minPsnr"]
    assert run.termination["cacheVerify"]["sampled"] == 1
    assert run.termination["cacheVerify"]["minPsnr"] == pytest.approx(measured, abs=0.01)
    assert not run.manifest(), "failed before the merge"


def test_disable_cache_turns_it_off_for_every_group_for_the_rest_of_the_job(
        tmp_path_factory: pytest.TempPathFactory, runtime_env: dict[str, str]) -> None:
    spec = shapes_job({**AGGRESSIVE, "verify": {**GATE, "onFail": "DisableCache"}}, prompts=8, processes=2)
    run = run_job(tmp_path_factory, runtime_env, "gate-disable", spec, processes=2)
    assert run.returncode == 0, run.stderr[-3000:]
    off = json.loads((run.output / "cache-off.json").read_text())
    assert (off["item"], off["missed"], off["threshold"]) == (run.manifest()[0]["key"], "minPsnr", 30)
    assert off["psnr"] < 30
    rows = run.manifest()
    first = rows[0]
    assert first["cacheVerify"]["psnr"] == off["psnr"] and "cache" not in first, "written as rendered without it"
    summary = job_json(run)["cacheVerify"]
    assert summary["verdict"] == "cacheDisabled" and summary["cacheDisabledFrom"] == off
    # The group that measured it turned it off at once; the other one renders with the cache until
    # its next chunk reads cache-off.json, and never again after (each group claims chunks in order).
    for rank in {row["rank"] for row in rows}:
        cached = [row.get("cache") == "FirstBlockCache" for row in rows if row["rank"] == rank]
        assert cached == sorted(cached, reverse=True), f"rank {rank} turned the cache back on: {cached}"
        if rank == first["rank"]:
            assert not any(cached), "the measuring group renders the rest without it"
    assert "turns FirstBlockCache off for the rest of the job" in run.stderr
    assert run.termination["cacheVerify"]["cacheOff"] is True, "the measuring group's pod says so"
