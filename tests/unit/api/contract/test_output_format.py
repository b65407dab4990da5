"""The output format's contract (muralist_api/contract/output_format.py): folders of older versions read as
today's, their chunks kept, and what this version cannot read refused by field.

The folders are the frozen fixtures older commits wrote (tests/fixtures/formats/); the runtime
test resumes each for real, these check the readers one by one in milliseconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from muralist_api.contract import PermanentFailure
from muralist_api.contract.output_folder import JobRecord
from muralist_api.contract.output_format import OUTPUT_FORMAT, Chunks, FormatError, infer_chunk_rows, read_entry
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.outputs import layouts, parts
from muralist_runtime.outputs.writer import JobFile
from muralist_runtime.work import chunks
from muralist_runtime.work.rows import inline_rows, items_of

from tests.paths import FIXTURES

FORMATS = FIXTURES / "formats"


def fixture(name: str, tmp_path: Path, job: str = "files", **output: object) -> RuntimeSpec:
    """A copy of a fixture's folder, and the runtime spec of its job writing there."""
    out = tmp_path / name
    if (FORMATS / name).is_dir():
        shutil.copytree(FORMATS / name, out)
    manifest = yaml.safe_load((FORMATS / "jobs" / f"{job}.yaml").read_text())
    spec = manifest["spec"]
    spec.setdefault("output", {}).update(output)
    return RuntimeSpec.model_validate({"name": manifest["metadata"]["name"], "spec": spec, "outputDir": str(out)})


def plan_of(runtime: RuntimeSpec) -> chunks.WorkPlan:
    return chunks.make_plan(runtime.spec, inline_rows(runtime).count(), 0)


def test_item_json_of_format_1_reads_as_todays_entry(tmp_path: Path) -> None:
    runtime = fixture("2a8e806-files", tmp_path)
    items = items_of(inline_rows(runtime).rows(0, 9), runtime.spec.generation)
    kept = layouts.FilesLayout(runtime, rank=0).kept(0, items).entries
    # 00003-000 has its JSON but no image (killed between the two): rendered again, not kept.
    assert sorted(kept) == ["00000-000", "00000-001", "00001-000", "00001-001", "00002-000", "00002-001"]
    entry = kept["00001-001"]
    assert (entry["index"], entry["promptIndex"], entry["imageIndex"]) == (3, 1, 1)
    assert (entry["id"], entry["kind"], entry["status"]) == (None, "image", "skipped")
    assert entry["prompt"] == "a lighthouse in a storm" and entry["file"] == "images/00001-001.png"


@pytest.mark.parametrize("name", ["a4144e8-files", "cd07f54-files", "a4144e8-webdataset"])
def test_part_files_of_formats_2_and_3_read(name: str) -> None:
    entries = parts.read_part(FORMATS / name, 0)
    assert entries and [e["index"] for e in entries] == list(range(len(entries)))
    assert all(e["status"] == "rendered" and e["kind"] == "image" for e in entries)


@pytest.mark.parametrize(("text", "why"), [
    ('{"key": "000', "line 1 is not JSON"),
    ("[1, 2]\n", "is a JSON object, not list"),
    ('{"index": 0}\n', "has a key <row>-<image>, not None"),
    ('{"key": "00000-000"}\n', "item 00000-000 has no index"),
    ("", "lists no item"),
])
def test_a_part_file_this_version_cannot_read_refuses_the_folder(tmp_path: Path, text: str, why: str) -> None:
    parts.part_path(tmp_path, 3).parent.mkdir()
    parts.part_path(tmp_path, 3).write_text(text)
    with pytest.raises(PermanentFailure) as refused:
        parts.read_part(tmp_path, 3)
    assert refused.value.field == "spec.output.path"
    assert str(parts.part_path(tmp_path, 3)) in str(refused.value) and why in str(refused.value)
    assert "render chunk 3 again" in str(refused.value)


def test_read_entry_fills_what_older_versions_left_out() -> None:
    assert read_entry({"key": "00012-003", "seed": 5}, "00012-003", 51) == {
        "key": "00012-003", "seed": 5, "promptIndex": 12, "imageIndex": 3, "index": 51, "id": None, "kind": "image"}
    assert read_entry({"seed": 5}, "00000-001", 1)["key"] == "00000-001", "the file name gives the key"
    with pytest.raises(FormatError, match="the entry of item 00000-001 names item 00000-002"):
        read_entry({"key": "00000-002", "index": 2}, "00000-001", 1)


@pytest.mark.parametrize("value", [OUTPUT_FORMAT + 1, 99])
def test_a_folder_of_a_newer_output_format_is_refused(tmp_path: Path, value: int) -> None:
    runtime = fixture("cd07f54-files", tmp_path)
    job = json.loads((tmp_path / "cd07f54-files" / "job.json").read_text())
    (tmp_path / "cd07f54-files" / "job.json").write_text(json.dumps({**job, "outputFormat": value}))
    with pytest.raises(PermanentFailure) as refused:
        JobFile(runtime).check_existing()
    assert str(refused.value) == (
        f"spec.output.path: {runtime.output_dir} was written in output format {value} by a newer Muralist version; "
        f"this one writes format {OUTPUT_FORMAT} and resumes formats 1-{OUTPUT_FORMAT}; run it with that version, "
        "or use another output.path")


@pytest.mark.parametrize("value", ["4", 0, True, 2.5])
def test_an_output_format_no_version_writes_is_refused(tmp_path: Path, value: object) -> None:
    runtime = fixture("cd07f54-files", tmp_path)
    job = json.loads((tmp_path / "cd07f54-files" / "job.json").read_text())
    (tmp_path / "cd07f54-files" / "job.json").write_text(json.dumps({**job, "outputFormat": value}))
    with pytest.raises(PermanentFailure, match=r"^spec.output.path: .* records outputFormat .*, which no Muralist"):
        JobFile(runtime).check_existing()


@pytest.mark.parametrize("name", ["2a8e806-files", "e831e2d-files", "a4144e8-files", "cd07f54-files", "7266f35-files"])
def test_every_older_job_json_of_the_same_job_resumes(tmp_path: Path, name: str) -> None:
    assert JobFile(fixture(name, tmp_path)).check_existing()[0] is not None


@pytest.mark.parametrize(("name", "job", "chunk_rows"), [
    ("2a8e806-files", "files", 1), ("e831e2d-files", "files", 1), ("a4144e8-files", "files", 3),
    ("cd07f54-files", "files", 1), ("7266f35-files", "files", 1),
    ("a4144e8-webdataset", "webdataset", 2), ("cd07f54-webdataset", "webdataset", 2),
    ("7266f35-webdataset", "webdataset", 2),
])
def test_each_fixture_resumes_in_its_own_chunks(tmp_path: Path, name: str, job: str, chunk_rows: int) -> None:
    runtime = fixture(name, tmp_path, job=job)
    recorded, _ = JobFile(runtime).check_existing()
    assert parts.resumed_plan(runtime, plan_of(runtime), recorded).chunk_rows == chunk_rows


def test_job_json_records_the_format_and_the_chunks(tmp_path: Path) -> None:
    jobfile = JobFile(fixture("new", tmp_path))
    jobfile.chunks = Chunks(0, 3)
    jobfile.write({"worldSize": 1})
    recorded, _ = jobfile.check_existing()
    assert recorded is not None
    assert (recorded.output_format, recorded.plan) == (OUTPUT_FORMAT, Chunks(0, 3))
    assert json.loads(jobfile.path.read_text())["plan"] == {"firstRow": 0, "chunkRows": 3}


@pytest.mark.parametrize(("parts", "first_row", "rows", "size"), [
    ({}, 0, 9, None),
    ({0: {0, 1, 2}}, 0, 9, 3),
    ({0: {0, 1, 2}, 1: {3, 4, 5}}, 0, 9, 3),
    ({1: {3, 4, 5}}, 0, 9, 3),
    ({2: {6, 7, 8}}, 0, 9, 3),  # the last chunk
    ({0: set(range(9))}, 0, 9, 9),  # one chunk was the whole job
    ({1: {13, 14, 15}}, 10, 9, 3),  # dataset.start 10
    ({0: {0}, 1: {1}}, 0, 9, 1),
])
def test_the_chunk_size_of_an_unversioned_folder_is_read_off_its_parts(parts, first_row, rows, size) -> None:
    assert infer_chunk_rows(parts, first_row, rows) == size


@pytest.mark.parametrize(("parts", "why"), [
    ({2: {5, 6}}, "parts/chunk-000002.jsonl listing rows 5-6, which is no chunk of rows counted from row 0"),
    ({1: {3, 4, 5, 6}}, "parts/chunk-000001.jsonl listing rows 3-6"),
    ({0: {1, 2}}, "parts/chunk-000000.jsonl listing rows 1-2"),
    ({0: {0, 1, 2}, 1: {1}}, "has part files of chunks of 1 and 3 rows"),
])
def test_part_files_that_are_no_chunks_are_refused(parts, why: str) -> None:
    with pytest.raises(FormatError, match=why):
        infer_chunk_rows(parts, 0, 9)


def test_a_resumed_folder_keeps_its_chunks_whatever_this_version_would_cut(tmp_path: Path) -> None:
    # Format 2 cut 9 rows of one group in chunks of 3; today's cut is 1 row. The part file
    # chunk-000000.jsonl lists rows 0-2: read as today's chunk 0 (row 0), chunk 1 would be
    # taken for unfinished and rows 1-2 listed twice in the manifest.
    old = fixture("a4144e8-files", tmp_path)
    assert plan_of(old).chunk_rows == 1
    assert parts.resumed_plan(old, plan_of(old), JobFile(old).check_existing()[0]).chunk_rows == 3
    assert parts.resumed_plan(old, plan_of(old), None).chunk_rows == 3, "job.json gone: the parts still tell"
    new = fixture("new", tmp_path)
    assert parts.resumed_plan(new, plan_of(new), None) == plan_of(new), "a new folder: this run's cut"
    recorded = JobRecord(output_format=OUTPUT_FORMAT, plan=Chunks(0, 2))
    assert parts.resumed_plan(new, plan_of(new), recorded).chunk_rows == 2, "another world's cut, recorded"


def test_a_webdataset_folder_of_other_shards_or_rows_is_refused(tmp_path: Path) -> None:
    runtime = fixture("a4144e8-webdataset", tmp_path, job="webdataset", shardSize=3)
    with pytest.raises(PermanentFailure, match=r"^spec.output.shardSize: .* holds shards of 2 rows, this job asks "
                                               r"for 3; set shardSize 2 to resume it"):
        parts.resumed_plan(runtime, plan_of(runtime), JobFile(runtime).check_existing()[0])
    moved = JobRecord(output_format=OUTPUT_FORMAT, plan=Chunks(4, 3))
    with pytest.raises(PermanentFailure, match=r"^spec.dataset.start: .* holds chunks counted from row 4, this job "
                                               r"starts at row 0"):
        parts.resumed_plan(runtime, plan_of(runtime), moved)
    job = json.loads((tmp_path / "a4144e8-webdataset" / "job.json").read_text())
    (tmp_path / "a4144e8-webdataset" / "job.json").write_text(json.dumps({**job, "plan": {"chunkRows": 0}}))
    with pytest.raises(PermanentFailure, match=r"^spec.output.path: .* records a plan \{'chunkRows': 0\}, not "):
        JobFile(runtime).check_existing()
