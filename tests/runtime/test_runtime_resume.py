"""A job reports exactly what it made, for exactly what was asked: a folder run again keeps an item only
when it was made for the same request (muralist_api/contract/resume.py), and belongs to one job.

Each run is one runtime process on a world of one (tests/runtime/test_runtime_formats.py's
`run_runtime`): what a one-process pod's worker runs, without torchrun's agent.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from muralist_api import contract
from PIL import Image

from .conftest import Run, make_job, runtime_spec_json
from .test_runtime_formats import run_runtime

pytestmark = pytest.mark.torchrun

PROMPTS = ["a red circle on a blue background", "a lighthouse in a storm", {"text": "a robot", "seed": 42}]
KEYS = ["00000-000", "00001-000", "00002-000"]


def files(out: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted((out / "images").iterdir())}


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory, runtime_env, tiny_model) -> tuple[Run, dict[str, Any]]:
    out = tmp_path_factory.mktemp("resume") / "out"
    out.mkdir()
    job = make_job().prompts(*PROMPTS).obj()
    run = run_runtime(runtime_spec_json(job, out, name="cats"), out, runtime_env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, job


def copy_of(run: Run, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(run.output, out)
    return out


def test_a_corrected_prompt_and_seed_render_exactly_those_items_again(first, tmp_path: Path, runtime_env) -> None:
    run, job = first
    out = copy_of(run, tmp_path)
    before = files(out)
    fixed = copy.deepcopy(job)
    fixed["prompts"][0] = "a green square on a white background"
    fixed["prompts"][2] = {"text": "a robot", "seed": 43}

    again = run_runtime(runtime_spec_json(fixed, out, name="cats"), out, runtime_env)

    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(e["key"] for e in again.events("completed")) == ["00000-000", "00002-000"]
    manifest = {m["key"]: m for m in again.manifest()}
    assert list(manifest) == KEYS
    assert (manifest["00000-000"]["status"], manifest["00000-000"]["prompt"], manifest["00000-000"]["replaced"]) == (
        "rendered", "a green square on a white background", ["prompt"])
    assert (manifest["00002-000"]["seed"], manifest["00002-000"]["replaced"]) == (43, ["seed"])
    assert manifest["00001-000"]["status"] == "skipped" and "replaced" not in manifest["00001-000"]
    assert again.meta("00000-000")["prompt"] == "a green square on a white background"
    assert Image.open(out / "images" / "00000-000.png").text["prompt"] == "a green square on a white background"
    after = files(out)
    assert after["00000-000.png"][0] != before["00000-000.png"][0], "a new picture for the new prompt"
    assert after["00001-000.png"] == before["00001-000.png"] and after["00001-000.json"] == before["00001-000.json"]
    # How many were kept, rendered again and new: in job.json, in the termination message (the status's source).
    assert json.loads((out / "job.json").read_text())["items"] == {"rendered": 2, "rerendered": 2, "skipped": 1}
    assert again.termination["job"] == {"completed": 2, "skipped": 1, "failed": 0, "total": 3, "rerendered": 2}
    assert (again.termination["rerendered"], again.termination["skipped"]) == (2, 1)

    # The same request once more: everything kept, nothing rendered.
    third = run_runtime(runtime_spec_json(fixed, out, name="cats"), out, runtime_env)
    assert third.returncode == 0, third.stderr[-3000:]
    assert third.events("completed") == []
    assert files(out) == after


def test_another_setting_renders_every_item_again(first, tmp_path: Path, runtime_env) -> None:
    run, job = first
    out = copy_of(run, tmp_path)
    stepped = copy.deepcopy(job)
    stepped["generation"]["steps"] = 3
    again = run_runtime(runtime_spec_json(stepped, out, name="cats"), out, runtime_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(e["key"] for e in again.events("completed")) == KEYS
    assert {m["key"]: m["replaced"] for m in again.manifest()} == {key: ["request"] for key in KEYS}


def test_another_jobs_folder_is_refused_unless_shared(first, tmp_path: Path, runtime_env) -> None:
    run, job = first
    out = copy_of(run, tmp_path)
    before = files(out)
    refused = run_runtime(runtime_spec_json(job, out, name="dogs"), out, runtime_env)
    assert refused.returncode == contract.PERMANENT_FAILURE_EXIT_CODE, refused.stderr[-3000:]
    assert refused.termination["message"] == (
        f"spec.output: {out} holds the outputs of DiffusionJob default/cats, not of default/dogs; use another "
        "spec.output.path, or set spec.output.shared: true to render into it (its items made for the same request "
        "are kept)")
    assert files(out) == before
    shared = copy.deepcopy(job)
    shared["output"] = {"shared": True}
    taken = run_runtime(runtime_spec_json(shared, out, name="dogs"), out, runtime_env)
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert taken.events("completed") == [], "the same requests: kept"
    assert json.loads((out / "job.json").read_text())["name"] == "dogs"


def test_a_replaced_input_photo_renders_its_item_again(tmp_path: Path, runtime_env, tiny_model,
                                                       inputs_dir: Path) -> None:
    photos = tmp_path / "inputs"
    shutil.copytree(inputs_dir, photos)
    job = make_job().prompts({"text": "a red fox", "image": "photos/noise.png", "strength": 0.7},
                             {"text": "a robot in a garden", "image": "photos/red.jpg"}).obj()
    job["model"]["pipeline"] = "FluxImg2ImgPipeline"
    job["inputs"] = {"volume": {"hostPath": {"path": str(photos)}}}
    out = tmp_path / "out"
    out.mkdir()
    spec = runtime_spec_json(job, out, inputs=photos, name="edits")
    first = run_runtime(spec, out, runtime_env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.meta("00001-000")["inputs"]["image"]["sha256"]
    Image.new("RGB", (64, 64), (20, 200, 40)).save(photos / "photos" / "red.jpg", quality=95)  # a new photo
    again = run_runtime(spec, out, runtime_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [e["key"] for e in again.events("completed")] == ["00001-000"]
    assert {m["key"]: m.get("replaced") for m in again.manifest()} == {"00000-000": None,
                                                                       "00001-000": ["inputs.image"]}
