"""A job's results read from its output folder, as the runtime's own merge leaves it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from muralist.results import item_bytes, open_image, output_folder, read_index
from muralist_api.job import DiffusionJob
from muralist_runtime.outputs.merge import merge

from tests.builders import make_job
from tests.paths import REPO

FORMATS = REPO / "tests" / "fixtures" / "formats"


def merged_folder(tmp_path: Path, fixture: str, failed_key: str | None = None) -> Path:
    """A frozen partial folder, merged by the runtime (index.parquet, manifest, gallery) as at a job's end."""
    folder = tmp_path / fixture
    shutil.copytree(FORMATS / fixture, folder)
    parts = sorted((folder / "parts").glob("chunk-*.jsonl"))
    if failed_key is not None:
        for part in parts:
            entries = [json.loads(line) for line in part.read_text().splitlines()]
            for entry in entries:
                if entry["key"] == failed_key:
                    entry.update(status="failed", error="CUDA out of memory", shard=None, file=None)
            part.write_text("".join(json.dumps(e) + "\n" for e in entries))
    merge(folder, len(parts), fixture, 200, {})
    return folder


@pytest.mark.parametrize("fixture", ["7266f35-files", "7266f35-webdataset"])
def test_index_and_images_of_either_layout(tmp_path: Path, fixture: str) -> None:
    folder = merged_folder(tmp_path, fixture, failed_key="00000-001")
    table = read_index(folder)
    assert table.column("key").to_pylist()[:3] == ["00000-000", "00000-001", "00001-000"]
    assert table.column("status").to_pylist()[:2] == ["rendered", "failed"]
    assert set(table.column_names) >= {"key", "prompt", "seed", "shard", "status", "error"}
    image = open_image(folder, "00001-000")
    assert (image.format, image.size) == ("PNG", (16, 16))
    with pytest.raises(LookupError, match="CUDA out of memory"):
        item_bytes(folder, "00000-001")
    with pytest.raises(KeyError, match="no item '99999-000'"):
        item_bytes(folder, "99999-000")


def test_index_as_pandas(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    frame = read_index(merged_folder(tmp_path, "7266f35-webdataset"), as_pandas=True)
    assert list(frame["shard"].unique()) == [0]


def test_a_folder_not_merged_yet_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no index yet"):
        read_index(tmp_path)


def test_output_folder_is_the_output_path_under_where_the_volume_is_mounted(tmp_path: Path) -> None:
    job = DiffusionJob.model_validate(make_job("cats").obj())
    assert output_folder(job, tmp_path) == tmp_path / "cats"
    with pytest.raises(ValueError, match="pass root="):
        output_folder(job)
    on_host = make_job("cats").set("spec.output", {"path": "runs/a", "volume": {"hostPath": {"path": "/data"}}})
    assert output_folder(DiffusionJob.model_validate(on_host.obj())) == Path("/data/runs/a")


def test_an_output_in_object_storage_is_read_at_its_uri() -> None:
    job = DiffusionJob.model_validate(make_job("cats").output(uri="s3://results/runs/", path="june").obj())
    assert output_folder(job) == "s3://results/runs/june"
    assert output_folder(job, "s3://mirror/copy") == "s3://mirror/copy/june", "root may name another bucket"
