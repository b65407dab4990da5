"""Object storage against a real S3 server on loopback (tests/s3_plugin.py): the output seam's
objects, data sets read by range, inputs read per item."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.model import inputs
from muralist_runtime.outputs import parts, shards, storage
from muralist_runtime.work.sources import Columns, RemotePath, RowSource, SourceError, location, readers

from tests.s3_plugin import S3Server


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.bucket()


def remote(s3_server: S3Server, uri: str) -> RemotePath:
    return RemotePath.from_uri(uri, s3_server.endpoint, {"use_listings_cache": False})


def runtime_for(tmp_path: Path, s3_server: S3Server, output_uri: str, **spec: Any) -> RuntimeSpec:
    doc = {"name": "t", "spec": {"model": {"name": "muralist/tiny-flux"}, "prompts": ["x"],
                                 "output": {"uri": output_uri.rsplit("/", 1)[0], "endpoint": s3_server.endpoint},
                                 **spec},
           "outputDir": str(tmp_path / "staging"), "outputUri": output_uri}
    return RuntimeSpec.model_validate(doc)


def test_the_object_seam_puts_whole_objects_and_lists_what_exists(tmp_path: Path, s3_server: S3Server,
                                                                  bucket: str) -> None:
    runtime = runtime_for(tmp_path, s3_server, f"s3://{bucket}/results/t")
    root = Path(runtime.output_dir)
    objects = storage.mount(runtime)
    try:
        assert storage.at(root / "parts" / "chunk-000000.jsonl") is objects
        assert storage.at(tmp_path / "elsewhere") is not objects, "other paths stay local files"
        parts.write_part(root, 0, [{"key": "00000-000", "index": 0, "promptIndex": 0, "status": "rendered"}])
        parts.write_part(root, 3, [{"key": "00003-000", "index": 3, "promptIndex": 3, "status": "rendered"}])
        fs = s3_server.filesystem()
        assert sorted(fs.ls(f"{bucket}/results/t/parts")) == [f"{bucket}/results/t/parts/chunk-{c:06d}.jsonl"
                                                              for c in (0, 3)]
        assert objects.names(root / "parts") == ["chunk-000000.jsonl", "chunk-000003.jsonl"]
        assert objects.names(root / "nothing") == []
        assert [e["key"] for e in parts.read_part(root, 3) or []] == ["00003-000"]
        assert parts.read_part(root, 1) is None, "a chunk not finished has no part object"
        assert objects.where(root / "index.parquet") == f"s3://{bucket}/results/t/index.parquet"

        # A streamed file: written to a local temp, uploaded once complete, the temp gone.
        with shards.ShardWriter(root / "shards", 0) as shard:
            shard.add("00000-000", {"png": b"pixels", "json": b"{}"})
            assert not fs.exists(f"{bucket}/results/t/shards/shard-000000.tar"), "nothing before it is complete"
        assert not list((root / "shards").iterdir()), "no local temp left"
        with objects.open_read(root / "shards" / "shard-000000.tar") as f:
            assert list(shards.read_shard(f)) == [("00000-000", {"png": b"pixels", "json": b"{}"})]
        objects.remove(root / "shards" / "shard-000000.tar")
        objects.remove(root / "shards" / "shard-000000.tar")  # gone already: no error
        assert not objects.exists(root / "shards" / "shard-000000.tar")
        with pytest.raises(FileNotFoundError):
            objects.read_bytes(root / "job.json")
    finally:
        storage.unmount(root)


def write_parquet(fs: Any, path: str, rows: list[dict[str, Any]], row_group_size: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=row_group_size)
    fs.pipe_file(path, buf.getvalue())


class CountingFile:
    """A file that counts the bytes read through it."""

    def __init__(self, f: Any, counter: list[int]):
        self._f, self._counter = f, counter

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._f.read(n)
        self._counter[0] += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def test_a_parquet_data_set_is_read_by_row_group_never_whole(s3_server: S3Server, bucket: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fs = s3_server.filesystem()
    # 30 row groups of 100 rows, each row with 1 KiB of random bytes the job does not map (~3 MiB).
    rows = [{"caption": f"prompt {i}", "seed": i, "padding": os.urandom(1024)} for i in range(3000)]
    write_parquet(fs, f"{bucket}/data/rows.parquet", rows, row_group_size=100)
    size = fs.size(f"{bucket}/data/rows.parquet")
    read = [0]
    opened = location.RemotePath.open_ranged
    monkeypatch.setattr(location.RemotePath, "open_ranged", lambda self: CountingFile(opened(self), read))
    source = RowSource(remote(s3_server, f"s3://{bucket}/data/rows.parquet"), "auto",
                       Columns(prompt="caption", seed="seed"))
    with source:
        assert source.count() == 3000
        got = [(r.index, r.prompt, r.seed) for r in source.rows(2900, 2903)]
    assert got == [(i, f"prompt {i}", i) for i in range(2900, 2903)]
    # pyarrow reads the footer on each open (three here: the check, the count, the read), ~100 KiB with
    # the padding's min/max statistics; then the mapped columns of one row group.
    assert 0 < read[0] < size / 5, f"read {read[0]} of {size} bytes: only footers and one row group's columns"


def test_a_json_lines_data_set_is_read_once_to_count_then_by_range_near_each_claim(
        s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = s3_server.filesystem()
    # ~200-byte prompts, as in a real data set: 40,000 rows, ~8.5 MB.
    rows = b"".join(json.dumps({"caption": f"prompt {i} " + "x" * 180, "seed": i}).encode() + b"\n"
                    for i in range(40_000))
    fs.pipe_file(f"{bucket}/data/rows.jsonl", rows)
    read = [0]
    opened = location.RemotePath.open
    monkeypatch.setattr(location.RemotePath, "open",
                        lambda self, *a, **k: CountingFile(opened(self, *a, **k), read))
    with RowSource(remote(s3_server, f"s3://{bucket}/data/rows.jsonl"), "auto",
                   Columns(prompt="caption", seed="seed")) as source:
        assert source.count() == 40_000
        counted = read[0]
        assert len(rows) <= counted < len(rows) + 2 * readers.BLOCK
        for begin in (30_000, 39_000, 12_345):
            read[0] = 0
            got = [(r.index, r.seed) for r in source.rows(begin, begin + 2)]
            assert got == [(begin, begin), (begin + 1, begin + 1)]
            assert read[0] <= 2 * readers.BLOCK, f"rows from {begin}: read {read[0]} of {len(rows)} bytes"


def test_a_folder_of_line_files_in_a_bucket_reads_as_one_sequence(s3_server: S3Server, bucket: str) -> None:
    fs = s3_server.filesystem()
    fs.pipe_file(f"{bucket}/rows/a.jsonl", b"".join(json.dumps({"p": f"a{i}"}).encode() + b"\n" for i in range(3)))
    fs.pipe_file(f"{bucket}/rows/b.jsonl", b'{"p": "b0"}\n\n{"p": "b1"}\n')
    fs.pipe_file(f"{bucket}/rows/_SUCCESS", b"")
    fs.pipe_file(f"{bucket}/table.csv", b"caption,seed\nfirst,1\nsecond,2\n")
    with RowSource(remote(s3_server, f"s3://{bucket}/rows"), "auto", Columns(prompt="p"), start=1) as source:
        assert source.count() == 4
        assert [r.prompt for r in source.rows(0, 10)] == ["a1", "a2", "b0", "b1"]
    with RowSource(remote(s3_server, f"s3://{bucket}/table.csv"), "auto", Columns(prompt="caption")) as source:
        assert [r.prompt for r in source.rows(0, 10)] == ["first", "second"]
    with pytest.raises(SourceError, match="no column 'text'"):
        RowSource(remote(s3_server, f"s3://{bucket}/rows"), "auto", Columns(prompt="text"))
    with pytest.raises(SourceError, match="no such file or folder"):
        RowSource(remote(s3_server, f"s3://{bucket}/absent.parquet"), "auto", Columns(prompt="p"))


def test_inputs_are_read_per_item_from_the_bucket(tmp_path: Path, s3_server: S3Server, bucket: str) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 10, 10)).save(buf, format="PNG")
    fs = s3_server.filesystem()
    fs.pipe_file(f"{bucket}/photos/red.png", buf.getvalue())
    fs.pipe_file(f"{bucket}/photos/broken.png", b"not an image")
    runtime = RuntimeSpec.model_validate({
        "name": "t", "outputDir": str(tmp_path), "inputsUri": f"s3://{bucket}/photos",
        "spec": {"model": {"name": "muralist/tiny-flux", "pipeline": "FluxImg2ImgPipeline"},
                 "prompts": [{"text": "x", "image": "red.png"}, {"text": "y", "image": "gone.png"}],
                 "inputs": {"uri": f"s3://{bucket}/photos", "endpoint": s3_server.endpoint}}})
    image = inputs.load_input(runtime, "image", "red.png")
    assert (image.size, image.mode) == ((8, 6), "RGB")
    with pytest.raises(inputs.InputError, match=r"image 'gone.png' not found in spec.inputs.uri"):
        inputs.load_input(runtime, "image", "gone.png")
    with pytest.raises(inputs.InputError, match="not a readable image"):
        inputs.load_input(runtime, "image", "broken.png")
    with pytest.raises(inputs.InputError, match="not a relative path"):
        inputs.load_input(runtime, "mask", "../secret.png")
    assert inputs.missing_inline_inputs(runtime) == [
        f"spec.prompts[1].image: image 'gone.png' not found in spec.inputs.uri (s3://{bucket}/photos)"]
