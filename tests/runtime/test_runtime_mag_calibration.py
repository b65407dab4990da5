"""MagCache on a model diffusers publishes no ratios for (the tiny Wan), under real torchrun: a
job with calibrate: true measures them on its first item and records them in job.json, and a
second job given those ratios renders the very same videos without calibrating."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.runtime.conftest import Run, make_job, runtime_spec_json, torchrun

STEPS = 6


def wan_job(cache_options: dict[str, Any]) -> dict[str, Any]:
    job = make_job().prompts("a red fox", {"text": "a lighthouse", "seed": 3}).set(
        "spec.model.name", "muralist/tiny-wan").output(format="mp4")
    job.generation(steps=STEPS, height=32, width=32, numFrames=9,
                   cache={"type": "MagCache", "options": cache_options})
    return job.obj()


def run(tmp_path: Path, name: str, job: dict[str, Any], env: dict[str, str]) -> tuple[Run, dict[str, Any]]:
    out = tmp_path / name
    done = torchrun(runtime_spec_json(job, out), out, env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads((out / "job.json").read_text())


def test_calibrated_ratios_are_recorded_and_a_second_job_reuses_them(tmp_path: Path, runtime_env: dict[str, str],
                                                                     tiny_wan: Path) -> None:
    first, recorded = run(tmp_path, "calibrate", wan_job({"calibrate": True, "threshold": 0.1}), runtime_env)
    calibration = recorded["cacheCalibration"]
    assert (calibration["type"], calibration["transformer"], calibration["steps"]) == (
        "MagCache", "WanTransformer3DModel", STEPS)
    assert calibration["item"] == first.manifest()[0]["key"]
    ratios = calibration["ratios"]
    assert len(ratios) == STEPS and ratios[0] == 1.0, "diffusers logs 1.0 for the first step (no previous residual)"
    assert all(r > 0 for r in ratios) and len(set(ratios)) > 1, "measured, not a constant"
    assert recorded["calibrateSeconds"] > 0
    assert "MagCache calibrated on item" in first.stderr

    second, again = run(tmp_path, "reuse", wan_job({"ratios": ratios, "threshold": 0.1}), runtime_env)
    assert "cacheCalibration" not in again and "MagCache calibrated" not in second.stderr
    videos = first.images("mp4")
    assert videos and second.images("mp4") == videos, "the same ratios, the same videos"


def test_without_ratios_or_calibration_magcache_says_how_to_get_them(tmp_path: Path, runtime_env: dict[str, str],
                                                                      tiny_wan: Path) -> None:
    out = tmp_path / "none"
    done = torchrun(runtime_spec_json(wan_job({}), out), out, runtime_env)
    assert done.returncode != 0 and done.termination["permanent"] is True
    assert done.termination["message"].startswith(
        "spec.generation.cache.options: MagCache needs magnitude ratios calibrated for this model "
        "(WanTransformer3DModel)")
    assert "calibrate: true" in done.termination["message"]
