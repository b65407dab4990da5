"""Workloads under real torchrun (CPU, gloo): videos, image-conditioned jobs, LoRA adapters,
a scheduler and a step cache. Each compares a parallel layout with one process.

"One process" is either a 1-process torchrun run, or the runtime's own render functions in
this process (conftest.render_in_process, one thread like every spawned rank): spawning
costs seconds on a busy 2-core box, so only the video reference is a real run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from .conftest import Run, make_job, render_in_process, runtime_spec_json, torchrun

pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[2]
VIDEO_EXAMPLE = REPO / "examples" / "quickstart-video-cpu.yaml"
VIDEO_KEYS = ["00000-000", "00001-000", "00002-000", "00003-000"]


def max_diff(a: Any, b: Any) -> int:
    assert a.shape == b.shape, (a.shape, b.shape)
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


# -- video ---------------------------------------------------------------------------------------


def video_job(**parallelism: Any) -> dict[str, Any]:
    """The video quickstart's spec with another parallelism section."""
    spec = yaml.safe_load(VIDEO_EXAMPLE.read_text())["spec"]
    spec["parallelism"] = {"strategy": "DataParallel", "gpusPerNode": 0, **parallelism}
    return spec


@pytest.fixture(scope="module")
def video_reference(tmp_path_factory: pytest.TempPathFactory, runtime_env, tiny_wan) -> Run:
    out = tmp_path_factory.mktemp("video") / "one"
    run = torchrun(runtime_spec_json(video_job(processesPerNode=1), out), out, runtime_env, 1)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_video_quickstart_renders_the_one_process_clips_on_two_processes(tmp_path: Path, runtime_env,
                                                                          video_reference: Run) -> None:
    import av

    out = tmp_path / "quickstart-video"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "muralist_cli", "run", str(VIDEO_EXAMPLE), "--output", str(out)],
                          env=runtime_env, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Run(0, proc.stdout, proc.stderr, out)
    assert [m["key"] for m in run.manifest()] == VIDEO_KEYS
    assert {m["rank"] for m in run.manifest()} == {0, 1}, "both data-parallel ranks rendered"
    for key in VIDEO_KEYS:
        with av.open(str(out / "images" / f"{key}.mp4")) as container:
            stream = container.streams.video[0]
            assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")
            assert sum(1 for _ in container.decode(video=0)) == 17
        meta = run.meta(key)
        assert (meta["kind"], meta["frames"], meta["fps"], meta["codec"], meta["container"]) == (
            "video", 17, 8, "h264", "mp4")
        assert (out / meta["poster"]).is_file()
        assert max_diff(run.pixels(key, "mp4"), video_reference.pixels(key, "mp4")) <= 1
    assert run.images("mp4") == video_reference.images("mp4"), "deterministic encoder: the same files"
    gallery = (out / "index.html").read_text()
    assert '<video src="images/00000-000.mp4" poster="images/00000-000.poster.jpg"' in gallery
    print(f"video quickstart: {elapsed:.1f}s")
    assert elapsed < 60


def test_video_with_ulysses_2_in_two_groups_matches_one_process(tmp_path: Path, runtime_env,
                                                               video_reference: Run) -> None:
    # World 4 = DP 2 x Ulysses 2, with the consistency canary comparing whole clips first.
    out = tmp_path / "cp"
    job = video_job(strategy="ContextParallel", processesPerNode=4, contextParallel={"ulyssesDegree": 2},
                    verify=True)
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 4)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "verify (group 0): max 0/255" in run.stderr and "verify (group 1): max 0/255" in run.stderr
    assert [m["key"] for m in run.manifest()] == VIDEO_KEYS
    assert {m["rank"] for m in run.manifest()} <= {0, 2}, "each group's first rank writes"
    for key in VIDEO_KEYS:
        assert max_diff(run.pixels(key, "mp4"), video_reference.pixels(key, "mp4")) <= 1


def test_image_to_video_takes_each_items_image(tiny_wan_i2v: Path, inputs_dir: Path) -> None:
    # In this process: WanImageToVideoPipeline takes `image` (one PIL image, not a list), and an
    # item without one fails on its own instead of failing the pipeline call.
    job = video_job()
    job["model"] = {"name": "muralist/tiny-wan-i2v", "dtype": "float32"}
    job["generation"].update(height=32, width=32, numFrames=9, steps=2)
    job["inputs"] = {"volume": {"hostPath": {"path": str(inputs_dir)}}}
    job["prompts"] = [{"text": "a red fox", "image": "photos/noise.png", "seed": 5},
                      {"text": "a red fox", "image": "photos/red.jpg", "seed": 5}, "a lighthouse"]
    out = render_in_process(job, tiny_wan_i2v, inputs_dir)
    fox, boat = out["00000-000"], out["00001-000"]
    assert fox.frames.shape == boat.frames.shape == (9, 32, 32, 3)
    # Same prompt and seed: the input image conditions the clip (weakly in this random model:
    # measured 3/255 at most; the image reaches it only as VAE latents beside the noise).
    assert max_diff(fox.frames, boat.frames) > 0
    assert fox.inputs["image"].mode == "RGB"
    assert out["00002-000"] == "WanImageToVideoPipeline needs an input image, and this item has none"


# -- image-conditioned jobs on the tiny Flux -----------------------------------------------------

EDIT_PROMPTS: dict[str, list[Any]] = {
    "FluxImg2ImgPipeline": [
        {"text": "a red fox", "image": "photos/noise.png", "strength": 0.7},
        {"text": "a robot in a garden", "image": "photos/red.jpg", "seed": 42},
        {"text": "a cat", "image": "photos/missing.png"},
        {"text": "a dog", "image": "photos/broken.png"},
    ],
    "FluxInpaintPipeline": [
        {"text": "a red fox", "image": "photos/noise.png", "mask": "photos/mask.png"},
        {"text": "a boat", "image": "photos/red.jpg", "mask": "photos/mask.png", "strength": 0.9},
    ],
    "FluxKontextPipeline": [
        {"text": "make it blue", "image": "photos/noise.png"},
        {"text": "a castle at night", "image": "photos/red.jpg"},
    ],
}


def edit_job(pipeline: str, inputs: Path) -> dict[str, Any]:
    job = make_job().prompts(*EDIT_PROMPTS[pipeline]).processes(2).obj()
    job["model"]["pipeline"] = pipeline
    job["inputs"] = {"volume": {"hostPath": {"path": str(inputs)}}}
    job["runPolicy"] = {"maxFailedItems": 2}  # the missing and the broken input fail alone (the default: none)
    return job


@pytest.mark.parametrize("pipeline", list(EDIT_PROMPTS))
def test_image_conditioned_jobs_do_not_depend_on_the_layout(pipeline: str, tmp_path: Path, runtime_env, tiny_model,
                                                            inputs_dir: Path) -> None:
    out = tmp_path / "edit"
    job = edit_job(pipeline, inputs_dir)
    run = torchrun(runtime_spec_json(job, out, inputs=inputs_dir), out, runtime_env, 2)
    assert run.returncode == 0, run.stderr[-3000:]
    one = render_in_process(job, tiny_model, inputs_dir)
    manifest = {m["key"]: m for m in run.manifest()}
    assert list(manifest) == list(one)
    for key, expected in one.items():
        if isinstance(expected, str):  # failed in both
            assert manifest[key]["status"] == "failed" and manifest[key]["error"] == expected
            continue
        assert manifest[key]["status"] == "rendered"
        assert run.pixels(key).shape == (32, 32, 3), "the job's size, not the input's"
        assert max_diff(run.pixels(key), expected.pixels()) <= 1
        assert (out / manifest[key]["input"]).is_file()
        assert ("mask" in manifest[key]) == (pipeline == "FluxInpaintPipeline")
    if pipeline == "FluxImg2ImgPipeline":
        # A missing or unreadable input fails its item alone, with the field and the path.
        assert manifest["00002-000"]["error"] == "image 'photos/missing.png' not found in spec.inputs.volume"
        assert manifest["00003-000"]["error"].startswith("image 'photos/broken.png' is not a readable image")
        assert json.loads((out / "job.json").read_text())["items"] == {"rendered": 2, "failed": 2}
        assert "Traceback" not in run.stderr
        assert manifest["00000-000"]["strength"] == 0.7 and manifest["00000-000"]["inputImage"] == "photos/noise.png"


MIXED_BATCHES = {
    # Strengths 0.5, 0.5, the pipeline's default, 0.9: three calls.
    "FluxImg2ImgPipeline": [{"text": "a red fox", "image": "photos/noise.png", "strength": 0.5},
                            {"text": "a boat", "image": "photos/red.jpg", "strength": 0.5},
                            {"text": "a castle", "image": "photos/red.jpg"},
                            {"text": "a cat", "image": "photos/noise.png", "strength": 0.9}],
    # Kontext also renders from text alone: with an image, with, without, with.
    "FluxKontextPipeline": [{"text": "a red fox", "image": "photos/noise.png"},
                            {"text": "a boat", "image": "photos/red.jpg"}, {"text": "a castle"},
                            {"text": "a cat", "image": "photos/noise.png"}],
}


@pytest.mark.parametrize("name", list(MIXED_BATCHES))
def test_a_batch_is_split_into_calls_that_render_each_item_as_alone(name: str, tiny_model: Path, inputs_dir: Path,
                                                                    monkeypatch) -> None:
    # A pipeline call takes one strength, and images for all its prompts or for none.
    from muralist_api.runtime_spec import RuntimeSpec
    from muralist_runtime.model import call, loading
    from muralist_runtime.work import rows

    job = make_job().prompts(*MIXED_BATCHES[name]).generation(batchSize=4).obj()
    job["model"]["pipeline"] = name
    job["inputs"] = {"volume": {"hostPath": {"path": str(inputs_dir)}}}
    alone = render_in_process(job, tiny_model, inputs_dir)
    runtime = RuntimeSpec.model_validate({"name": "t", "spec": job, "outputDir": "/unused",
                                          "inputsDir": str(inputs_dir)})
    pipe = loading.load_pipeline(runtime, str(tiny_model), None)
    calls: list[list[str]] = []
    original = call._call
    monkeypatch.setattr(call, "_call", lambda pipe, runtime, batch, *a: calls.append([i.key for i in batch])
                        or original(pipe, runtime, batch, *a))
    items = rows.items_of(rows.open_rows(runtime).rows(0, 4), runtime.spec.generation)
    together = call.render_checked(pipe, runtime, items)
    assert calls == [["00000-000", "00001-000"], ["00002-000"], ["00003-000"]]
    for item, (output, reason) in zip(items, together, strict=True):
        assert reason is None, reason
        assert max_diff(output.pixels(), alone[item.key].pixels()) <= 1, item.key


# -- LoRA adapters, scheduler, step cache --------------------------------------------------------


def test_lora_scheduler_and_taylorseer_under_ulysses_2_match_one_process(tmp_path: Path, runtime_env,
                                                                         tiny_model: Path, tiny_lora: Path) -> None:
    # All three are applied before enable_parallelism; TaylorSeer is safe in a CP group.
    out = tmp_path / "features"
    job = make_job().processes(2).context_parallel(ulysses=2).generation(steps=6).obj()
    job["model"]["adapters"] = [{"name": str(tiny_lora), "scale": 1.0}]
    job["generation"]["scheduler"] = {"name": "FlowMatchEulerDiscreteScheduler", "config": {"shift": 2.0}}
    job["generation"]["cache"] = {"type": "TaylorSeer", "options": {"cacheInterval": 2, "disableCacheBeforeStep": 2}}
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"LoRA adapters: {tiny_lora} x1" in run.stderr
    assert "scheduler FlowMatchEulerDiscreteScheduler {'shift': 2.0}" in run.stderr
    assert "step cache TaylorSeer on FluxTransformer2DModel" in run.stderr
    one = render_in_process(job, tiny_model)
    plain = render_in_process({**job, "model": {"name": "muralist/tiny-flux", "dtype": "float32"}}, tiny_model)
    no_lora = render_in_process({**job, "model": {"name": "muralist/tiny-flux", "dtype": "float32"},
                                 "generation": {**job["generation"], "cache": None}}, tiny_model)
    base = render_in_process({**job, "model": {"name": "muralist/tiny-flux", "dtype": "float32"},
                              "generation": {k: v for k, v in job["generation"].items() if k not in
                                             ("scheduler", "cache")}}, tiny_model)
    for key in one:
        assert max_diff(run.pixels(key), one[key].pixels()) <= 1, "two layouts agree"
        assert max_diff(run.pixels(key), plain[key].pixels()) > 20, "the adapter changes the image"
        assert max_diff(plain[key].pixels(), no_lora[key].pixels()) > 0, "the cache changes it"
        assert max_diff(no_lora[key].pixels(), base[key].pixels()) > 0, "the scheduler changes it"
    meta = run.meta("00000-000")
    assert (meta["scheduler"], meta["cache"]) == ("FlowMatchEulerDiscreteScheduler", "TaylorSeer")
    assert meta["adapters"] == [{"name": str(tiny_lora), "scale": 1.0}]
    gallery = (out / "index.html").read_text()
    assert "scheduler <b>FlowMatchEulerDiscreteScheduler</b>" in gallery
    assert f"adapter <b>{tiny_lora}</b> &times;1.0" in gallery
