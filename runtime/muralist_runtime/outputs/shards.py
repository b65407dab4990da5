"""Dataset-scale outputs: WebDataset tar shards of samples, and one Parquet index of every item.

Ten million loose files overwhelm object stores and `ls`; WebDataset shards (plain tar files
whose members `<key>.<ext>` sharing a key form one sample, e.g. `00000042.png` +
`00000042.json`) are what training pipelines stream anyway. A shard is written by one rank,
in item order, to a temp name in the same directory and renamed when closed: a shard on disk
is complete, and a killed writer leaves only a temp file (temps.py names and clears those).

Shard bytes are deterministic: fixed mtime (0), uid/gid 0, empty owner names, mode 0o644 and
members in the order added, so the same items give the same shard on any world size or date.

The index is a Parquet file streamed in row groups (`IndexWriter`): one row per item (its
key, shard, status, seconds, error, ...), never all rows in memory.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from muralist_api.contract.output_folder import member_name, shard_name

from . import storage, temps

_KEY = re.compile(r"[^./\\\s][^./\\]*")
_EXT = re.compile(r"[^/\\\s]+")


def shard_path(directory: Path, shard_index: int) -> Path:
    return directory / shard_name(shard_index)


class ShardWriter:
    """Writes one shard; `add` samples in item order, then `close()` (or `abort()`).

    A context manager: leaving the block with an exception aborts, so no partial shard appears.
    Members stream straight into the tar: memory holds one member at a time, and a Path value
    (e.g. a video written by an encoder) is copied from disk, never read whole.
    """

    def __init__(self, directory: Path, shard_index: int):
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = shard_path(Path(directory), shard_index)
        self.tmp = temps.opened(temps.temp_path(self.path))
        self.samples = 0
        self._keys: set[str] = set()
        self._file: IO[bytes] = open(self.tmp, "wb")  # noqa: SIM115 - closed by close()/abort()
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def add(self, key: str, members: Mapping[str, bytes | Path]) -> None:
        """One sample: `{ext: data}` becomes members `<key>.<ext>`, in the mapping's order.

        A key has no dots (WebDataset splits a member name at its first dot), and a key is used
        once per shard: readers group consecutive members by key, so a repeat would merge samples.
        """
        if not _KEY.fullmatch(key):
            raise ValueError(f"sample key {key!r}: non-empty, without '.', '/' or leading whitespace")
        if key in self._keys:
            raise ValueError(f"sample key {key!r} is already in {self.path.name}")
        if not members:
            raise ValueError(f"sample {key!r} has no members")
        for ext, data in members.items():
            if not _EXT.fullmatch(ext):
                raise ValueError(f"member extension {ext!r} of {key!r}: non-empty, without '/' or whitespace")
            info = tarfile.TarInfo(member_name(key, ext))
            info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o644, 0, 0, "", ""
            if isinstance(data, Path):
                info.size = data.stat().st_size
                with open(data, "rb") as f:
                    self._tar.addfile(info, f)
            else:
                info.size = len(data)
                self._tar.addfile(info, io.BytesIO(data))
        self._keys.add(key)
        self.samples += 1

    def close(self) -> Path:
        """Finish the tar, fsync it and rename it into place; returns the shard's path (raises
        temps.TempRemoved when the job merged meanwhile and its temp was cleaned up)."""
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        storage.at(self.path).publish(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Drop the shard: its temp file goes, nothing appears under the final name."""
        self._file.close()
        self.tmp.unlink(missing_ok=True)
        temps.closed(self.tmp)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_shard(source: Path | IO[bytes]) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Samples of a shard (a file, or one opened for reading) in order, as (key, {ext: bytes}),
    grouped like WebDataset groups them."""
    key: str | None = None
    sample: dict[str, bytes] = {}
    with (tarfile.open(source, "r:") if isinstance(source, Path)
          else tarfile.open(fileobj=source, mode="r:")) as tar:
        for info in tar:
            if not info.isfile():
                continue
            directory, _, base = info.name.rpartition("/")
            stem, _, ext = base.partition(".")
            name = f"{directory}/{stem}" if directory else stem
            if name != key and key is not None:
                yield key, sample
                sample = {}
            key = name
            f = tar.extractfile(info)
            assert f is not None  # a regular file always has data
            sample[ext] = f.read()
    if key is not None:
        yield key, sample


def index_schema() -> Any:
    """The index's columns; `IndexWriter(schema=...)` takes an extended copy for more.

    index: the item's row in the source; key: its sample key; shard: the shard it is in (null
    when it failed); status: "ok" | "failed" | "skipped"; seconds: generation time.
    """
    import pyarrow as pa

    return pa.schema([
        ("index", pa.int64()), ("id", pa.string()), ("key", pa.string()), ("prompt", pa.string()),
        ("seed", pa.int64()), ("shard", pa.int64()), ("status", pa.string()), ("seconds", pa.float64()),
        ("error", pa.string()),
    ])


class IndexWriter:
    """Streams index rows to Parquet, one row group per `batch_rows` rows; temp name + rename.

    Rows are dicts keyed by schema column; a missing column is null, an unknown one an error.
    Memory holds at most one batch of rows as Python objects.
    """

    def __init__(self, path: Path, schema: Any = None, batch_rows: int = 8192):
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.tmp = temps.opened(temps.temp_path(self.path))
        self.schema = schema if schema is not None else index_schema()
        self.batch_rows = batch_rows
        self.rows = 0
        self._lines: list[str] = []  # the pending rows, as JSON
        self._writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd")

    def write(self, row: Mapping[str, Any]) -> None:
        if unknown := row.keys() - set(self.schema.names):
            raise ValueError(f"index row has unknown columns {sorted(unknown)}; the schema has {self.schema.names}")
        self._lines.append(json.dumps(row))
        self.rows += 1
        if len(self._lines) >= self.batch_rows:
            self._flush()

    def _flush(self) -> None:
        """The pending rows as a row group, through pyarrow's JSON reader: arrays made from Python objects
        (pa.array, RecordBatch.from_pydict) ask whether pandas is installed, importing it, which cost 0.3 s at
        the end of every job, on the rank that merges."""
        if not self._lines:
            return
        import pyarrow.json as pa_json

        table = pa_json.read_json(io.BytesIO("\n".join(self._lines).encode()),
                                  read_options=pa_json.ReadOptions(use_threads=False),
                                  parse_options=pa_json.ParseOptions(explicit_schema=self.schema))
        self._writer.write_table(table.select(self.schema.names))
        self._lines = []

    def close(self) -> Path:
        self._flush()
        self._writer.close()
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())
        storage.at(self.path).publish(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        self._writer.close()
        self.tmp.unlink(missing_ok=True)
        temps.closed(self.tmp)

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_index(path: Path) -> list[dict[str, Any]]:
    """The whole index as dicts: for tests and small jobs (a big index: pyarrow.parquet directly)."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows
