"""Outputs: the two layouts, chunk part files, the streaming merge, job.json and resume,
the writer threads."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from muralist_api.contract import PermanentFailure
from muralist_api.contract.output_folder import JobRecord
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.outputs import layouts, merge, parts, shards, temps
from muralist_runtime.outputs.writer import JobFile, atomic_write_text
from muralist_runtime.work.rows import inline_rows, items_of
from PIL import Image


def runtime(out: Path, steps: int = 2, fmt: str = "png", layout: str = "files") -> RuntimeSpec:
    return RuntimeSpec.model_validate({
        "name": "w", "outputDir": str(out),
        "spec": {"model": {"name": "muralist/tiny-flux", "dtype": "float32"},
                 "prompts": ["a <b>cat</b> & \"dog\"", {"text": "x", "negativePrompt": "blur", "id": "sku-7"}],
                 "generation": {"steps": steps, "imagesPerPrompt": 2},
                 "output": {"format": fmt, "layout": layout}},
    })


def all_items(spec: RuntimeSpec):
    rows = inline_rows(spec)
    return items_of(rows.rows(0, rows.count()), spec.spec.generation)


@pytest.fixture
def files(tmp_path: Path) -> layouts.FilesLayout:
    layout = layouts.FilesLayout(runtime(tmp_path / "out"), rank=1)
    layout.prepare()
    return layout


IMG = layouts.RenderedOutput(image=Image.new("RGB", (4, 4), (10, 20, 30)))


def test_files_layout_and_metadata(files: layouts.FilesLayout) -> None:
    item = all_items(files.runtime)[3]
    entry = files.write(0, item, IMG, 0.5)
    assert files.image_path(item).name == "00001-001.png"
    meta = json.loads(files.meta_path(item).read_text())
    assert {k: meta[k] for k in ("prompt", "negativePrompt", "seed", "steps", "rank", "seconds", "id", "index",
                                 "model", "dtype", "guidanceScale", "height", "width", "file")} == {
        "prompt": "x", "negativePrompt": "blur", "seed": 3, "steps": 2, "rank": 1, "seconds": 0.5, "id": "sku-7",
        "index": 3, "model": "muralist/tiny-flux", "dtype": "float32", "guidanceScale": 3.5, "height": 1024,
        "width": 1024, "file": "images/00001-001.png"}
    assert entry["status"] == "rendered"
    text = Image.open(files.image_path(item)).text
    assert text["prompt"] == "x" and text["seed"] == "3"
    assert "rank" not in text and "seconds" not in text, "PNG bytes stay layout-independent"
    assert files.item_done(item)
    assert not list(files.images.glob(".*")), "no temp file left"


def test_png_bytes_do_not_depend_on_rank_or_time(tmp_path: Path) -> None:
    a = layouts.FilesLayout(runtime(tmp_path / "a"), rank=0)
    b = layouts.FilesLayout(runtime(tmp_path / "b"), rank=3)
    a.prepare()
    b.prepare()
    item = all_items(a.runtime)[0]
    a.write(0, item, IMG, 0.1)
    b.write(5, item, IMG, 9.9)
    assert a.image_path(item).read_bytes() == b.image_path(item).read_bytes()


def test_done_means_image_and_metadata(files: layouts.FilesLayout) -> None:
    item = all_items(files.runtime)[0]
    # A kill between the two renames leaves the metadata only: not done, rendered again.
    atomic_write_text(files.meta_path(item), json.dumps(layouts.metadata(files.runtime, item, 0, 0.1)))
    assert not files.item_done(item)
    files.image_path(item).write_bytes(b"x")
    assert files.item_done(item)
    kept = files.kept(0, all_items(files.runtime)[:2])
    assert [(key, entry["key"], entry["index"], entry["status"]) for key, entry in kept.entries.items()] == [
        ("00000-000", "00000-000", 0, "skipped")]


def rendered(spec: RuntimeSpec, item) -> layouts.RenderedOutput:  # type: ignore[no-untyped-def]
    """An output as the claim loop hands it to the writer: with its request's record."""
    from muralist_runtime.outputs import requests

    return layouts.RenderedOutput(image=IMG.image, metadata=requests.record(spec, item))


def corrected(out: Path, **fields) -> RuntimeSpec:  # type: ignore[no-untyped-def]
    """runtime(out) with its first prompt replaced (a corrected manifest, applied again)."""
    spec = runtime(out)
    doc = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    doc["spec"]["prompts"][0] = fields.get("prompt", doc["spec"]["prompts"][0])
    doc["spec"]["generation"].update(fields.get("generation", {}))
    return RuntimeSpec.model_validate(doc)


def written(out: Path) -> tuple[layouts.FilesLayout, list]:  # type: ignore[type-arg]
    """A files layout in `out` with every item of runtime(out) written to chunk 0."""
    spec = runtime(out)
    layout = layouts.FilesLayout(spec, rank=0)
    layout.prepare()
    items = all_items(spec)
    for item in items:
        layout.write(0, item, rendered(spec, item), 0.1)
    return layout, items


def test_an_item_on_disk_is_kept_only_for_the_request_it_was_made_for(tmp_path: Path) -> None:
    layout, items = written(tmp_path)
    assert sorted(layout.kept(0, items).entries) == [i.key for i in items] and not layout.kept(0, items).stale
    # The first prompt corrected: both of its images are made for another request now.
    fixed = corrected(tmp_path, prompt="a green square on a white background")
    kept = layouts.FilesLayout(fixed, rank=0).kept(0, all_items(fixed))
    assert kept.stale == {"00000-000": ["prompt"], "00000-001": ["prompt"]}
    assert sorted(kept.entries) == ["00001-000", "00001-001"]
    # Another base seed: every item here numbers its seed from it.
    reseeded = corrected(tmp_path, generation={"seed": 5})
    assert layouts.FilesLayout(reseeded, rank=0).kept(0, all_items(reseeded)).stale == {
        i.key: ["seed"] for i in items}
    # A setting every item shares: the digest says so (the record's own fields are the same).
    stepped = corrected(tmp_path, generation={"steps": 3})
    assert layouts.FilesLayout(stepped, rank=0).kept(0, all_items(stepped)).stale == {
        i.key: ["request"] for i in items}


def test_a_replaced_output_goes_before_its_new_metadata_is_written(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = runtime(tmp_path)
    layout = layouts.FilesLayout(spec, rank=0)
    layout.prepare()
    item = all_items(spec)[0]
    layout.write(0, item, rendered(spec, item), 0.1)
    fixed = corrected(tmp_path, prompt="a green square")
    new_item = all_items(fixed)[0]
    again = layouts.FilesLayout(fixed, rank=0)
    output = rendered(fixed, new_item)
    output.metadata["replaced"] = ["prompt"]

    def killed(path: Path, data: bytes, fsync: bool = True) -> None:  # dies before the new output is written
        if path.suffix == ".png":
            raise OSError("killed")
        atomic_write_text(path, data.decode()) if path.suffix == ".json" else None

    monkeypatch.setattr(layouts, "atomic_write_bytes", killed)
    with pytest.raises(OSError, match="killed"):
        again.write(0, new_item, output, 0.1)
    assert not again.item_done(new_item), "never the new record beside the old picture: rendered again"
    monkeypatch.undo()
    again.write(0, new_item, output, 0.1)
    assert json.loads(again.meta_path(new_item).read_text())["prompt"] == "a green square"
    assert new_item.key in again.kept(0, [new_item]).entries


def test_an_output_cut_short_is_rendered_again(tmp_path: Path) -> None:
    layout, items = written(tmp_path)
    # A machine that crashed before the chunk ended: files renamed into place, their data lost or cut short.
    layout.image_path(items[0]).write_bytes(b"")
    whole = layout.image_path(items[1]).read_bytes()
    layout.image_path(items[1]).write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))
    # A record of an earlier version, without size or CRC: its output was fsynced, and is kept as before.
    older = json.loads(layout.meta_path(items[2]).read_text())
    del older["bytes"], older["crc32"]
    atomic_write_text(layout.meta_path(items[2]), json.dumps(older))
    kept = layout.kept(0, items)
    assert sorted(kept.entries) == [i.key for i in items[2:]] and not kept.stale


def test_a_chunks_files_are_fsynced_when_it_ends_before_its_part_file_names_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    spec = runtime(tmp_path)
    layout = layouts.FilesLayout(spec, rank=0)
    layout.prepare()
    items = all_items(spec)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    entries = [layout.write(0, item, rendered(spec, item), 0.1) for item in items[:2]]
    assert synced == [], "an item's files are not fsynced one by one"
    layout.end_chunk(0)
    parts.write_part(tmp_path, 0, entries)
    files = [str(p) for i in items[:2] for p in (layout.meta_path(i), layout.image_path(i))]
    assert sorted(synced[:4]) == sorted(files) and synced[4] == str(layout.images), "files, then their folder"
    assert synced[5].startswith(str(tmp_path / "parts")) and len(synced) == 6, "then the part file"
    # A chunk taken again keeps what an earlier pod wrote (perhaps drained before its chunk ended): its part
    # file names those too, so they are fsynced with the chunk's new ones.
    synced.clear()
    layout.begin_chunk(1, layout.kept(1, items[:2]).entries)
    layout.write(1, items[2], rendered(spec, items[2]), 0.1)
    layout.end_chunk(1)
    assert sorted(synced[:-1]) == sorted([*files, str(layout.meta_path(items[2])), str(layout.image_path(items[2]))])
    layout.begin_chunk(2, {})
    layout.write(2, items[3], rendered(spec, items[3]), 0.1)
    layout.abandon_chunk(2)
    synced.clear()
    layout.end_chunk(2)
    assert synced == [], "an abandoned chunk's files are the next taker's to make durable"


def test_prepare_removes_temp_files_of_dead_writers(files: layouts.FilesLayout) -> None:
    keep = files.images / "00000-000.png"
    keep.write_bytes(b"done")
    stale = temps.temp_path(keep).with_name(f".00000-000.png.{temps._host()}-999999.tmp")
    stale.write_bytes(b"partial")
    files.prepare()
    assert not stale.exists() and keep.exists()


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_other_formats(tmp_path: Path, fmt: str) -> None:
    layout = layouts.FilesLayout(runtime(tmp_path, fmt=fmt), rank=0)
    layout.prepare()
    item = all_items(layout.runtime)[0]
    layout.write(0, item, IMG, 0.0)
    assert layout.image_path(item).suffix == f".{fmt}"
    assert Image.open(layout.image_path(item)).format == {"jpeg": "JPEG", "webp": "WEBP"}[fmt]


def video_runtime(out: Path, fmt: str = "mp4", layout: str = "files") -> RuntimeSpec:
    return RuntimeSpec.model_validate({
        "name": "v", "outputDir": str(out),
        "spec": {"model": {"name": "muralist/tiny-wan", "dtype": "float32"}, "prompts": ["a fox"],
                 "generation": {"steps": 2, "height": 16, "width": 16, "numFrames": 5, "fps": 8},
                 "output": {"format": fmt, "layout": layout}},
    })


def clip(frames: int = 5) -> layouts.RenderedOutput:
    import numpy as np

    ramp = np.linspace(0, 255, frames * 16 * 16 * 3).reshape(frames, 16, 16, 3).astype(np.uint8)
    return layouts.RenderedOutput(frames=ramp)


@pytest.mark.parametrize("fmt", ["mp4", "webp", "gif"])
def test_video_files_with_poster_and_metadata(tmp_path: Path, fmt: str) -> None:
    from muralist_runtime.outputs import media

    layout = layouts.FilesLayout(video_runtime(tmp_path, fmt), rank=0)
    layout.prepare()
    item = all_items(layout.runtime)[0]
    entry = layout.write(0, item, clip(), 0.3)
    meta = json.loads(layout.meta_path(item).read_text())
    assert {k: meta[k] for k in ("kind", "frames", "fps", "file", "poster")} == {
        "kind": "video", "frames": 5, "fps": 8, "file": f"images/00000-000.{fmt}",
        "poster": "images/00000-000.poster.jpg"}
    assert {k: meta[k] for k in ("codec", "container", "pixelFormat")} == media.video_info(fmt)
    assert entry["status"] == "rendered"
    frames = media.decode_video(layout.image_path(item).read_bytes(), fmt, fps=8)
    assert frames.shape == (5, 16, 16, 3)
    assert Image.open(tmp_path / "images" / "00000-000.poster.jpg").size == (16, 16)
    assert layout.item_done(item)


def test_video_in_a_webdataset_shard(tmp_path: Path) -> None:
    spec = video_runtime(tmp_path, layout="webdataset")
    layout = layouts.WebDatasetLayout(spec, rank=0)
    layout.prepare()
    item = all_items(spec)[0]
    layout.begin_chunk(0, {})
    meta = layout.add(0, item, layout.write(0, item, clip(), 0.1))
    layout.end_chunk(0)
    assert meta["kind"] == "video" and meta["codec"] == "h264"
    [(key, members)] = shards.read_shard(tmp_path / "shards" / "shard-000000.tar")
    assert key == "00000-000" and sorted(members) == ["json", "mp4"]


def test_input_thumbnails_beside_the_output(files: layouts.FilesLayout) -> None:
    item = all_items(files.runtime)[0]
    photo = Image.new("RGB", (640, 320), (200, 10, 10))
    mask = Image.new("L", (640, 320), 255)
    meta = files.write(0, item, layouts.RenderedOutput(image=IMG.image, inputs={"image": photo, "mask": mask}), 0.1)
    assert (meta["input"], meta["mask"]) == ("images/00000-000.input.jpg", "images/00000-000.mask.jpg")
    thumb = Image.open(files.root / meta["input"])
    assert thumb.size == (256, 128) and Image.open(files.root / meta["mask"]).mode == "L"
    assert json.loads(files.meta_path(item).read_text())["input"] == meta["input"]


def test_webdataset_shard_per_chunk_and_a_retry_keeps_what_it_had(tmp_path: Path) -> None:
    spec = runtime(tmp_path, layout="webdataset")
    layout = layouts.WebDatasetLayout(spec, rank=0)
    layout.prepare()
    items = all_items(spec)
    layout.begin_chunk(0, {})
    entries = [layout.add(0, i, layout.write(0, i, IMG, 0.1)) for i in items[:3]]
    entries.append(layouts.failed_entry(spec, items[3], 0, "input image missing"))
    layout.end_chunk(0)
    parts.write_part(tmp_path, 0, entries)
    with tarfile.open(tmp_path / "shards" / "shard-000000.tar") as tar:
        assert tar.getnames() == ["00000-000.png", "00000-000.json", "00000-001.png", "00000-001.json",
                                  "00001-000.png", "00001-000.json"]
    # A later attempt renders only the failed item and keeps the others' members.
    kept = layout.kept(0, items)
    assert sorted(kept.entries) == ["00000-000", "00000-001", "00001-000"] and not kept.stale
    layout.begin_chunk(0, kept.entries)
    layout.add(0, items[3], layout.write(0, items[3], IMG, 0.1))
    layout.end_chunk(0)
    assert [key for key, _ in shards.read_shard(tmp_path / "shards" / "shard-000000.tar")] == [
        "00000-000", "00000-001", "00001-000", "00001-001"]


def test_merge_streams_parts_into_manifest_index_and_gallery(tmp_path: Path) -> None:
    spec = runtime(tmp_path)
    layout = layouts.FilesLayout(spec, rank=0)
    layout.prepare()
    items = all_items(spec)
    parts.write_part(tmp_path, 1, [layouts.failed_entry(spec, items[2], 1, "NaN"),
                                     layout.write(1, items[3], IMG, 0.2)])
    parts.write_part(tmp_path, 0, [layout.write(0, i, IMG, 0.1) for i in items[:2]])
    counts = merge.merge(tmp_path, 3, "w", page_size=200, caption={"model": "m"})  # chunk 2: unfinished
    assert counts == {"rendered": 3, "failed": 1}
    lines = [json.loads(x) for x in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert [(m["key"], m["status"]) for m in lines] == [
        ("00000-000", "rendered"), ("00000-001", "rendered"), ("00001-000", "failed"), ("00001-001", "rendered")]
    assert [r["key"] for r in shards.read_index(tmp_path / "index.parquet")] == [m["key"] for m in lines]
    assert "00001-001.png" in (tmp_path / "index.html").read_text()


def test_the_merge_fails_retryably_naming_a_missing_part_and_who_held_it(tmp_path: Path) -> None:
    from muralist_runtime.work.chunks import WorkPlan

    spec = runtime(tmp_path)
    layout = layouts.FilesLayout(spec, rank=0)
    layout.prepare()
    items = all_items(spec)
    plan = WorkPlan(start=0, rows=2, chunk_rows=1, images_per_prompt=2)
    parts.write_part(tmp_path, 0, [layout.write(0, i, IMG, 0.1) for i in items[:2]])

    def held(chunk: int) -> str:
        return "pod 1" if chunk == 1 else ""

    # Chunk 1 was rendered by pod 1 on an emptyDir of its own: its part is not where the first pod looks.
    with pytest.raises(merge.MergeIncomplete) as missing:
        merge.merge(tmp_path, 2, "w", 200, {}, plan=plan, holder=held)
    assert str(missing.value) == (
        f"no part file for 1 chunk(s) in {tmp_path}: 1 (rendered by pod 1); the first pod cannot see them: is "
        "spec.output a volume every pod mounts (a ReadWriteMany volume, or a uri)? Failing this pod, so that its "
        "retry renders them again")
    assert not (tmp_path / "manifest.jsonl").exists() and not (tmp_path / "index.html").exists(), "nothing published"
    # A part that lists less than its chunk: never a success either.
    parts.write_part(tmp_path, 1, [layout.write(1, items[2], IMG, 0.1)])
    with pytest.raises(merge.MergeIncomplete, match=r"^parts/chunk-000001.jsonl does not list its chunk's items "
                                                    r"exactly once \(chunk 1, rendered by pod 1\): missing 00001-001"):
        merge.merge(tmp_path, 2, "w", 200, {}, plan=plan, holder=held)
    assert not (tmp_path / "manifest.jsonl").exists()
    parts.write_part(tmp_path, 1, [layout.write(1, i, IMG, 0.1) for i in items[2:]])
    assert merge.merge(tmp_path, 2, "w", 200, {}, plan=plan, holder=held) == {"rendered": 4}


def test_the_merge_tries_a_part_that_cannot_be_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from muralist_runtime.work.chunks import WorkPlan

    spec = runtime(tmp_path)
    layout = layouts.FilesLayout(spec, rank=0)
    layout.prepare()
    items = all_items(spec)
    plan = WorkPlan(start=0, rows=1, chunk_rows=1, images_per_prompt=2)
    parts.write_part(tmp_path, 0, [layout.write(0, i, IMG, 0.1) for i in items[:2]])
    load = parts.load_part
    failures = iter([OSError(5, "Input/output error")] * 2)

    def flaky(root: Path, chunk: int):  # type: ignore[no-untyped-def]
        error = next(failures, None)
        if error is not None:
            raise error
        return load(root, chunk)

    monkeypatch.setattr(parts, "load_part", flaky)
    monkeypatch.setattr(merge, "READ_PAUSE_SECONDS", 0.01)
    assert merge.merge(tmp_path, 1, "w", 200, {}, plan=plan) == {"rendered": 2}, "read on the third try"
    monkeypatch.setattr(parts, "load_part", lambda root, chunk: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(merge.MergeIncomplete, match=r"^parts/chunk-000000.jsonl \(chunk 0\) cannot be read \(I/O "
                                                    r"error\) after 4 tries"):
        merge.merge(tmp_path, 1, "w", 200, {}, plan=plan)


def test_job_json_and_mixing_refused(tmp_path: Path) -> None:
    JobFile(runtime(tmp_path)).write({"worldSize": 2})
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["world"] == {"worldSize": 2} and job["spec"]["outputDir"] == str(tmp_path)
    assert job["versions"]["diffusers"] and job["digestVersion"] == 2
    recorded, trust = JobFile(runtime(tmp_path)).check_existing()  # same parameters: resume
    assert recorded is not None and trust.legacy
    assert recorded.model_dump(by_alias=True, mode="json", exclude_unset=True) == job
    # Other settings of the same job: items are kept by their request digests, records of older versions not.
    assert JobFile(runtime(tmp_path, steps=3)).check_existing()[1].legacy is False
    other = runtime(tmp_path).model_copy(update={"name": "x"})
    with pytest.raises(PermanentFailure, match=r"^spec.output: .* holds the outputs of DiffusionJob default/w"):
        JobFile(other).check_existing()


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
    assert JobFile(runtime(tmp_path)).check_existing()[1].legacy, "its records are kept by what they name"
    assert not JobFile(runtime(tmp_path, steps=3)).check_existing()[1].legacy, "other settings: rendered again"


def test_digest_covers_pixels_only_and_ignores_defaults() -> None:
    from muralist_api.contract.resume import recorded_digest, spec_digest
    from muralist_api.options import Adapter
    from muralist_api.step_cache import CacheSpec

    base = runtime(Path("/o")).spec
    same = [base.model_copy(update={"generation": base.generation.model_copy(update=change)})
            for change in ({"batch_size": 4}, {"compile": True}, {"vae_tiling": False})]
    assert {spec_digest(s) for s in same} == {spec_digest(base)}
    other = base.model_copy(update={"generation": base.generation.model_copy(update={"vae_tiling": True})})
    assert spec_digest(other) != spec_digest(base), "tiled decoding changes pixels"
    lora = base.model_copy(update={"model": base.model.model_copy(update={"adapters": [Adapter(name="/l")]})})
    assert spec_digest(lora) != spec_digest(base), "an adapter changes pixels"
    cached = base.model_copy(update={"generation": base.generation.model_copy(
        update={"cache": CacheSpec(type="TaylorSeer")})})
    assert spec_digest(cached) != spec_digest(base), "a step cache changes pixels"
    assert recorded_digest(JobRecord(digest_version=2, spec_digest="x")) == "x"
    newer = legacy_job_json(runtime(Path("/o")), ())
    newer["spec"]["spec"]["generation"]["someFutureField"] = 1
    assert recorded_digest(JobRecord.model_validate(newer)) is None, "unknown fields may change pixels"


# -- the background writer ---------------------------------------------------------------------


def test_background_writer_queue_is_bounded() -> None:
    import threading

    from muralist_runtime.outputs.writer import BackgroundWriter

    release = threading.Event()
    started = threading.Event()

    def slow_write(chunk, task, image, seconds) -> None:
        started.set()
        release.wait(10)

    bg = BackgroundWriter(slow_write, maxsize=2, threads=1)
    tasks = [object() for _ in range(4)]
    bg.submit(0, tasks[0], IMG, 0.0)
    assert started.wait(5)  # the thread holds image 0; two more fit in the queue
    bg.submit(0, tasks[1], IMG, 0.0)
    bg.submit(0, tasks[2], IMG, 0.0)
    blocked = threading.Thread(target=bg.submit, args=(0, tasks[3], IMG, 0.0))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive(), "the generating loop waits while the queue is full"
    assert bg.completed() == [], "nothing counts before it is written"
    release.set()
    blocked.join(5)
    bg.close()
    assert [w.item for w in bg.completed()] == tasks


def test_a_write_that_never_finishes_fails_the_run_after_the_bound_naming_the_output() -> None:
    import threading
    import time

    from muralist_runtime.outputs.writer import BackgroundWriter, WriteStalled

    hung = threading.Event()
    bg = BackgroundWriter(lambda *_args: hung.wait(30), maxsize=1, threads=1, stall_seconds=0.5,
                          where="s3://results/cats")
    bg.submit(0, object(), IMG, 0.0)  # the thread hangs in it
    bg.submit(0, object(), IMG, 0.0)  # queued
    start = time.monotonic()
    with pytest.raises(WriteStalled, match=r"^waited \d+s for a place in the queue of items to write: no write to "
                                           r"s3://results/cats finished meanwhile"):
        bg.submit(0, object(), IMG, 0.0)
    with pytest.raises(WriteStalled, match="for the items in the queue to be written"):
        bg.wait_idle()
    with pytest.raises(WriteStalled):
        bg.close()
    assert time.monotonic() - start < 10, "each wait ends at its bound"
    hung.set()


def test_background_writer_completion_order_is_free_and_all_counted(files: layouts.FilesLayout) -> None:
    import threading

    from muralist_runtime.outputs.writer import BackgroundWriter

    tasks = all_items(files.runtime)
    first_may_finish = threading.Event()

    def write(chunk, task, image, seconds):
        if task == tasks[0]:
            first_may_finish.wait(5)  # the first image is the slowest to encode
        entry = files.write(chunk, task, image, seconds)
        if task == tasks[-1]:
            first_may_finish.set()
        return entry

    bg = BackgroundWriter(write, maxsize=8, threads=2)
    for t in tasks:
        bg.submit(0, t, IMG, 0.1)
    bg.close()
    done = [w.item for w in bg.completed()]
    assert sorted(done, key=lambda t: t.key) == tasks and done[-1] == tasks[0]
    assert all(files.item_done(t) for t in tasks)
    assert not list(files.images.glob(".*")), "no temp file left"


def test_background_writer_error_reaches_the_generating_thread(files: layouts.FilesLayout) -> None:
    from muralist_runtime.outputs.writer import BackgroundWriter

    tasks = all_items(files.runtime)

    def write(chunk, task, image, seconds):
        if task == tasks[1]:
            raise OSError(28, "No space left on device")
        return files.write(chunk, task, image, seconds)

    bg = BackgroundWriter(write, maxsize=8, threads=1)
    bg.submit(0, tasks[0], IMG, 0.0)
    bg.submit(0, tasks[1], IMG, 0.0)
    with pytest.raises(RuntimeError, match="No space left on device"):
        bg.wait_idle()
    with pytest.raises(RuntimeError, match="writing an image failed"):
        bg.submit(0, tasks[2], IMG, 0.0)
    with pytest.raises(RuntimeError):
        bg.close()
    bg.close(raise_error=False)  # idempotent, quiet on the failure path
    assert [w.item for w in bg.completed()] == [tasks[0]], "only what is on disk counts"
    assert not files.item_done(tasks[1])
