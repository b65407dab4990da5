"""The output writer: atomic files, resume, manifest merge, job.json, gallery escaping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from muralist_runtime.spec.contract import PermanentFailure
from muralist_runtime.spec.items import image_tasks
from muralist_runtime.spec.resolved import RuntimeSpec
from muralist_runtime.writer import OutputWriter, atomic_write_text, gallery_html
from PIL import Image


def runtime(out: Path, steps: int = 2, fmt: str = "png") -> RuntimeSpec:
    return RuntimeSpec.model_validate({
        "name": "w", "outputDir": str(out),
        "spec": {"model": {"name": "muralist/tiny-flux", "dtype": "float32"},
                 "prompts": ["a <b>cat</b> & \"dog\"", {"text": "x", "negativePrompt": "blur"}],
                 "generation": {"steps": steps, "imagesPerPrompt": 2},
                 "output": {"format": fmt}},
    })


@pytest.fixture
def writer(tmp_path: Path) -> OutputWriter:
    w = OutputWriter(runtime(tmp_path / "out"), rank=1)
    w.prepare()
    return w


def all_tasks(w: OutputWriter):
    return image_tasks(w.runtime.spec.prompt_objects, w.runtime.spec.generation)


IMG = Image.new("RGB", (4, 4), (10, 20, 30))


def test_write_image_layout_and_metadata(writer: OutputWriter) -> None:
    task = all_tasks(writer)[3]
    writer.write_image(task, IMG, 0.5)
    assert writer.image_path(task).name == "00001-001.png"
    meta = json.loads(writer.meta_path(task).read_text())
    assert {k: meta[k] for k in ("prompt", "negativePrompt", "seed", "steps", "rank", "seconds",
                                 "model", "dtype", "guidanceScale", "height", "width")} == {
        "prompt": "x", "negativePrompt": "blur", "seed": 3, "steps": 2, "rank": 1,
        "seconds": 0.5, "model": "muralist/tiny-flux", "dtype": "float32",
        "guidanceScale": 3.5, "height": 1024, "width": 1024}
    text = Image.open(writer.image_path(task)).text
    assert text["prompt"] == "x" and text["seed"] == "3"
    assert "rank" not in text and "seconds" not in text, "PNG bytes stay layout-independent"
    assert writer.is_complete(task)
    assert not list(writer.images.glob(".*")), "no temp file left"


def test_png_bytes_do_not_depend_on_rank_or_time(tmp_path: Path) -> None:
    a = OutputWriter(runtime(tmp_path / "a"), rank=0)
    b = OutputWriter(runtime(tmp_path / "b"), rank=3)
    a.prepare()
    b.prepare()
    task = all_tasks(a)[0]
    a.write_image(task, IMG, 0.1)
    b.write_image(task, IMG, 9.9)
    assert a.image_path(task).read_bytes() == b.image_path(task).read_bytes()


def test_complete_means_image_and_metadata(writer: OutputWriter) -> None:
    task = all_tasks(writer)[0]
    # A kill between the two renames leaves the metadata only: not complete, re-rendered.
    atomic_write_text(writer.meta_path(task), "{}")
    assert not writer.is_complete(task)
    writer.image_path(task).write_bytes(b"x")
    assert writer.is_complete(task)


def test_prepare_removes_stale_temp_files(writer: OutputWriter) -> None:
    stale = writer.images / ".00000-000.png.4242.tmp"
    stale.write_bytes(b"partial")
    keep = writer.images / "00000-000.png"
    keep.write_bytes(b"done")
    writer.prepare()
    assert not stale.exists() and keep.exists()


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_other_formats(tmp_path: Path, fmt: str) -> None:
    w = OutputWriter(runtime(tmp_path, fmt=fmt), rank=0)
    w.prepare()
    task = all_tasks(w)[0]
    w.write_image(task, IMG, 0.0)
    assert w.image_path(task).suffix == f".{fmt}"
    assert Image.open(w.image_path(task)).format == {"jpeg": "JPEG", "webp": "WEBP"}[fmt]


def test_merge_manifest_lists_images_on_disk_sorted_with_status(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r0, r1 = OutputWriter(runtime(out), 0), OutputWriter(runtime(out), 1)
    r0.prepare()
    tasks = all_tasks(r0)
    r1.write_image(tasks[2], IMG, 0.2)
    r0.write_image(tasks[0], IMG, 0.1)
    # tasks[1]: from an earlier attempt whose rank manifest was lost; tasks[3]: missing.
    OutputWriter(runtime(out), 5).write_image(tasks[1], IMG, 0.3)
    (out / "manifest.rank-5.jsonl").unlink()
    r0.log(tasks[0], "skipped")  # a later attempt skipped it: latest status wins
    with open(out / "manifest.rank-1.jsonl", "a") as f:
        f.write('{"key": "000')  # a line cut by a kill is ignored
    lines = r0.merge_manifest(tasks)
    assert [(m["key"], m["status"], m["rank"]) for m in lines] == [
        ("00000-000", "skipped", 0), ("00000-001", "skipped", 5), ("00001-000", "rendered", 1)]
    on_disk = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    assert on_disk == lines


def test_job_json_and_mixing_refused(tmp_path: Path) -> None:
    w = OutputWriter(runtime(tmp_path), 0)
    w.prepare()
    w.write_job({"worldSize": 2})
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["world"] == {"worldSize": 2} and job["spec"]["outputDir"] == str(tmp_path)
    assert job["versions"]["diffusers"]
    OutputWriter(runtime(tmp_path), 0).check_existing_job()  # same parameters: resume
    with pytest.raises(PermanentFailure, match=r"^spec.output.path: "):
        OutputWriter(runtime(tmp_path, steps=3), 0).check_existing_job()


def legacy_job_json(spec: RuntimeSpec, drop: tuple[str, ...]) -> dict:
    """job.json as Muralist 0.1 wrote it, before `drop` (fields of spec.generation) existed:
    no digestVersion, its own digest formula, the spec without those fields."""
    recorded = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    for name in drop:
        del recorded["spec"]["generation"][name]
    return {"name": "w", "specDigest": "0123456789abcdef", "spec": recorded}


def test_an_output_folder_of_an_older_version_resumes(tmp_path: Path) -> None:
    # An operator or runtime upgrade mid-job adds spec fields with defaults: the folder its
    # first pod group wrote must resume, not fail permanently.
    (tmp_path / "job.json").write_text(json.dumps(legacy_job_json(runtime(tmp_path), ("vaeTiling", "compile"))))
    OutputWriter(runtime(tmp_path), 0).check_existing_job()
    with pytest.raises(PermanentFailure, match="other model/generation parameters"):
        OutputWriter(runtime(tmp_path, steps=3), 0).check_existing_job()


def test_digest_covers_pixels_only_and_ignores_defaults() -> None:
    from muralist_runtime.spec.resume import recorded_digest, spec_digest

    base = runtime(Path("/o")).spec
    same = [base.model_copy(update={"generation": base.generation.model_copy(update=change)})
            for change in ({"batch_size": 4}, {"compile": True}, {"vae_tiling": False})]
    assert {spec_digest(s) for s in same} == {spec_digest(base)}
    other = base.model_copy(update={"generation": base.generation.model_copy(update={"vae_tiling": True})})
    assert spec_digest(other) != spec_digest(base), "tiled decoding changes pixels"
    assert recorded_digest({"digestVersion": 2, "specDigest": "x"}) == "x"
    newer = legacy_job_json(runtime(Path("/o")), ())
    newer["spec"]["spec"]["generation"]["someFutureField"] = 1
    assert recorded_digest(newer) is None, "fields this version does not know may change pixels"


def test_gallery_escapes_user_strings() -> None:
    page = gallery_html("<job>", [{"key": "00000-000", "seed": 1, "file": "images/a\".png",
                                   "prompt": "<script>alert(1)</script> & co",
                                   "negativePrompt": "'bad'"}])
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "&amp; co" in page and "&#x27;bad&#x27;" in page and 'a&quot;.png' in page
    assert "<title>&lt;job&gt;" in page


# -- the background writer ---------------------------------------------------------------------


def test_background_writer_queue_is_bounded() -> None:
    import threading

    from muralist_runtime.writer import BackgroundWriter

    release = threading.Event()
    started = threading.Event()

    def slow_write(task, image, seconds) -> None:
        started.set()
        release.wait(10)

    bg = BackgroundWriter(slow_write, maxsize=2, threads=1)
    tasks = [object() for _ in range(4)]
    bg.submit(tasks[0], IMG, 0.0)
    assert started.wait(5)  # the thread holds image 0; two more fit in the queue
    bg.submit(tasks[1], IMG, 0.0)
    bg.submit(tasks[2], IMG, 0.0)
    blocked = threading.Thread(target=bg.submit, args=(tasks[3], IMG, 0.0))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive(), "the generating loop waits while the queue is full"
    assert bg.completed() == [], "nothing counts before it is written"
    release.set()
    blocked.join(5)
    bg.close()
    assert [w.task for w in bg.completed()] == tasks


def test_background_writer_completion_order_is_free_and_all_counted(writer: OutputWriter) -> None:
    import threading

    from muralist_runtime.writer import BackgroundWriter

    tasks = all_tasks(writer)
    first_may_finish = threading.Event()

    def write(task, image, seconds) -> None:
        if task == tasks[0]:
            first_may_finish.wait(5)  # the first image is the slowest to encode
        writer.write_image(task, image, seconds)
        if task == tasks[-1]:
            first_may_finish.set()

    bg = BackgroundWriter(write, maxsize=8, threads=2)
    for t in tasks:
        bg.submit(t, IMG, 0.1)
    bg.close()
    done = [w.task for w in bg.completed()]
    assert sorted(done, key=lambda t: t.key) == tasks and done[-1] == tasks[0]
    assert all(writer.is_complete(t) for t in tasks)
    assert not list(writer.images.glob(".*")), "no temp file left"


def test_background_writer_error_reaches_the_generating_thread(writer: OutputWriter) -> None:
    from muralist_runtime.writer import BackgroundWriter

    tasks = all_tasks(writer)

    def write(task, image, seconds) -> None:
        if task == tasks[1]:
            raise OSError(28, "No space left on device")
        writer.write_image(task, image, seconds)

    bg = BackgroundWriter(write, maxsize=8, threads=1)
    bg.submit(tasks[0], IMG, 0.0)
    bg.submit(tasks[1], IMG, 0.0)
    with pytest.raises(RuntimeError, match="No space left on device"):
        bg.wait_idle()
    with pytest.raises(RuntimeError, match="writing an image failed"):
        bg.submit(tasks[2], IMG, 0.0)
    with pytest.raises(RuntimeError):
        bg.close()
    bg.close(raise_error=False)  # idempotent, quiet on the failure path
    assert [w.task for w in bg.completed()] == [tasks[0]], "only what is on disk counts"
    assert not writer.is_complete(tasks[1])
