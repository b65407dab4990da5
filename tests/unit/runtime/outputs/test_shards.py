"""WebDataset shards and the Parquet index: round trips, deterministic bytes, no partial files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import tracemalloc
from pathlib import Path

import pytest
from muralist_runtime.outputs import temps
from muralist_runtime.outputs.shards import (
    IndexWriter,
    ShardWriter,
    index_schema,
    read_index,
    read_shard,
    shard_path,
)
from muralist_runtime.outputs.temps import remove_stale as remove_stale_temps


def sample(i: int) -> dict[str, bytes]:
    return {"png": bytes([i % 256]) * (100 + i), "json": json.dumps({"prompt": f"item {i}", "seed": i}).encode()}


def write_shard(directory: Path, index: int = 1, items: range = range(5)) -> Path:
    with ShardWriter(directory, index) as w:
        for i in items:
            w.add(f"{i:08d}", sample(i))
    return w.path


def test_round_trip_with_tarfile(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "out", 3)
    assert path == tmp_path / "out" / "shard-000003.tar"
    assert [(k, s) for k, s in read_shard(path)] == [(f"{i:08d}", sample(i)) for i in range(5)]
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    assert [m.name for m in members[:4]] == ["00000000.png", "00000000.json", "00000001.png", "00000001.json"]
    assert {(m.mtime, m.mode, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0o644, 0, 0, "", "")}
    assert os.listdir(tmp_path / "out") == ["shard-000003.tar"], "no temp file left"


def test_webdataset_reads_the_shards(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    paths = [write_shard(tmp_path, 0, range(0, 3)), write_shard(tmp_path, 1, range(3, 5))]
    got = list(wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in got] == [f"{i:08d}" for i in range(5)]
    assert [(s["png"], s["json"]) for s in got] == [(sample(i)["png"], sample(i)["json"]) for i in range(5)]
    decoded = next(iter(wds.WebDataset([str(paths[0])], shardshuffle=False).decode()))
    assert decoded["json"] == {"prompt": "item 0", "seed": 0}


def test_large_members_stream_from_a_file(tmp_path: Path) -> None:
    video = tmp_path / "clip.mp4"
    video.write_bytes(os.urandom(3 << 20))
    with ShardWriter(tmp_path / "v", 0) as w:
        w.add("00000000", {"mp4": video, "json": b"{}"})
    [(key, members)] = list(read_shard(w.path))
    assert key == "00000000"
    assert members["mp4"] == video.read_bytes()


def test_shard_bytes_depend_only_on_the_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write_shard(tmp_path / "a")
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)
    monkeypatch.setattr(os, "getuid", lambda: 1234)
    b = write_shard(tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    assert len(a.read_bytes()) % tarfile.RECORDSIZE == 0


def test_keys_and_extensions_are_checked(tmp_path: Path) -> None:
    w = ShardWriter(tmp_path, 0)
    for bad in ["a.b", "", "dir/x", " x"]:
        with pytest.raises(ValueError, match="sample key"):
            w.add(bad, {"png": b"x"})
    with pytest.raises(ValueError, match="extension"):
        w.add("k", {"p/ng": b"x"})
    w.add("k", {"png": b"x"})
    with pytest.raises(ValueError, match=r"already in shard-000000\.tar"):
        w.add("k", {"json": b"{}"})
    w.abort()
    assert os.listdir(tmp_path) == []


def test_an_exception_in_the_block_leaves_no_shard(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), ShardWriter(tmp_path, 7) as w:
        w.add("00000001", sample(1))
        raise RuntimeError("encoder failed")
    assert os.listdir(tmp_path) == []


def test_a_killed_writer_leaves_only_a_temp_that_cleanup_removes(tmp_path: Path) -> None:
    code = (f"import os, sys; sys.path[:0] = {sys.path!r}\n"
            "from pathlib import Path; from muralist_runtime.outputs.shards import ShardWriter\n"
            f"w = ShardWriter(Path({str(tmp_path)!r}), 2)\n"
            "for i in range(50): w.add(f'{i:08d}', {'png': os.urandom(10_000)})\n"
            "w._file.flush(); print(w.tmp, flush=True); os._exit(9)  # killed: no close, no atexit")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    tmp = Path(proc.stdout.strip())
    assert sorted(os.listdir(tmp_path)) == [tmp.name], "only the temp, never a partial shard-000002.tar"
    assert tmp.name.startswith(".shard-000002.tar.") and tmp.name.endswith(".tmp")
    assert tmp.stat().st_size > 0

    live = ShardWriter(tmp_path, 3)  # this process's open shard is not stale
    other_host = tmp_path / ".shard-000004.tar.other-pod-17.tmp"
    other_host.write_bytes(b"x")
    assert remove_stale_temps(tmp_path) == [tmp], "its process is dead; the other pod's temp is fresh"
    assert remove_stale_temps(tmp_path, min_age_s=0) == [other_host]
    assert live.close() == shard_path(tmp_path, 3)
    assert sorted(os.listdir(tmp_path)) == ["shard-000003.tar"]


def test_index_round_trip(tmp_path: Path) -> None:
    rows = [{"index": 0, "id": "a", "key": "00000000", "prompt": "p", "seed": 5, "shard": 0, "status": "ok",
             "seconds": 1.5},
            {"index": 1, "key": "00000001", "prompt": "q", "status": "failed", "error": "column 'seed': ..."}]
    with IndexWriter(tmp_path / "index.parquet", batch_rows=1) as w:
        for r in rows:
            w.write(r)
    got = read_index(w.path)
    assert got[0] == {**rows[0], "error": None}
    assert got[1] == {"index": 1, "id": None, "key": "00000001", "prompt": "q", "seed": None, "shard": None,
                      "status": "failed", "seconds": None, "error": "column 'seed': ..."}
    assert os.listdir(tmp_path) == ["index.parquet"]
    with pytest.raises(ValueError, match=r"unknown columns \['sed'\]"):
        IndexWriter(tmp_path / "x.parquet").write({"sed": 1})


def test_writing_the_index_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas when asked to make arrays of Python objects: 0.3 s at the end of every job."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path\n"
            "from muralist_runtime.outputs.shards import IndexWriter, read_index\n"
            f"w = IndexWriter(Path({str(tmp_path / 'index.parquet')!r}))\n"
            "w.write({'index': 0, 'key': '00000-000', 'prompt': 'a \\u00e9 \\U0001f600', 'seed': 2 ** 62}); w.close()\n"
            "assert 'pandas' not in sys.modules, 'pandas imported'\n"
            "print(read_index(w.path)[0]['prompt'], read_index(w.path)[0]['seed'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["a", "\u00e9", "\U0001f600", str(2 ** 62)]


def test_an_empty_or_aborted_index(tmp_path: Path) -> None:
    assert read_index(IndexWriter(tmp_path / "empty.parquet").close()) == []
    w = IndexWriter(tmp_path / "gone.parquet")
    w.write({"index": 0})
    w.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.parquet"]


def test_index_of_100k_rows_streams_in_small_memory(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, batch = 100_000, 4096

    def row(i: int) -> dict:
        return {"index": i, "id": f"id-{i}", "key": f"{i:08d}", "prompt": f"a photo of item {i} " * 3, "seed": i,
                "shard": i // 1000, "status": "ok", "seconds": 0.25}

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    w = IndexWriter(tmp_path / "index.parquet", batch_rows=batch)
    arrow_peak = 0
    for i in range(n):
        w.write(row(i))
        if i % 997 == 0:
            arrow_peak = max(arrow_peak, pa.total_allocated_bytes())
    w.close()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    tracemalloc.start()
    everything = [row(i) for i in range(n)]
    all_rows = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del everything
    assert peak - base < all_rows / 10, f"peak {peak - base} B vs {all_rows} B for all rows as Python objects"
    assert arrow_peak < 32 << 20, "Arrow holds about one batch, not the table"
    meta = pq.ParquetFile(tmp_path / "index.parquet").metadata
    assert (meta.num_rows, meta.num_row_groups) == (n, -(-n // batch))
    assert meta.schema.to_arrow_schema() == index_schema()
    last = pq.ParquetFile(tmp_path / "index.parquet").read_row_group(meta.num_row_groups - 1).to_pylist()[-1]
    assert last == row(n - 1) | {"error": None}


def test_temp_names_survive_dotted_host_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(temps.socket, "gethostname", lambda: "node.example.com")
    w = ShardWriter(tmp_path, 9)
    assert w.tmp.name == f".shard-000009.tar.node_example_com-{os.getpid()}.tmp"
    w._file.close()
    temps.closed(w.tmp)  # as if this were a previous life of this process
    assert remove_stale_temps(tmp_path) == [w.tmp]
