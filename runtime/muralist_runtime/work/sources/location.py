"""A source in object storage (spec.dataset.uri), read by range through fsspec (opened by
muralist_api.storage.open_location, with spec.dataset.endpoint).

`RemotePath` is the few parts of `pathlib.Path` that `detect` and the readers use (name, suffix,
stem, `/`, exists, is_dir, iterdir, open), over an fsspec file system, so one code path reads a
mounted volume and a bucket. A file is opened for ranged reads: Parquet without a cache (pyarrow
asks for the footer, then each column chunk it decodes, by range), line formats with a read-ahead
block, so no rank downloads the data set, and a folder is listed once.
"""

from __future__ import annotations

import posixpath
from typing import IO, Any

from muralist_api.storage import open_location, protocol

# Read-ahead of the line readers (JSON Lines, CSV, text): one request per block.
LINE_BLOCK = 4 << 20


class RemotePath:
    """An object (or a prefix, a folder) under an fsspec file system, named by its URI."""

    def __init__(self, fs: Any, key: str, protocol: str, kind: str | None = None):
        self.fs, self.key, self.protocol = fs, key.rstrip("/"), protocol
        self.kind = kind  # "file" or "directory" when a listing said so: no request to ask again

    @classmethod
    def from_uri(cls, uri: str, endpoint: str | None = None, options: dict[str, Any] | None = None) -> RemotePath:
        """The object or prefix `uri` names, with its section's endpoint (and more fsspec `options`)."""
        fs, key = open_location(uri, endpoint, options)
        return cls(fs, key, protocol(uri))

    def __str__(self) -> str:
        return f"{self.protocol}://{self.key}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and (other.key, other.protocol) == (self.key, self.protocol)

    def __hash__(self) -> int:
        return hash((self.protocol, self.key))

    def __lt__(self, other: RemotePath) -> bool:
        return self.key < other.key

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(self.fs, posixpath.join(self.key, name), self.protocol)

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.name)[1]

    @property
    def stem(self) -> str:
        return posixpath.splitext(self.name)[0]

    def _info(self) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = self.fs.info(self.key)
        except FileNotFoundError:
            return None
        return info

    def exists(self) -> bool:
        return self._info() is not None

    def is_dir(self) -> bool:
        if self.kind is not None:
            return self.kind == "directory"
        info = self._info()
        return info is not None and info.get("type") == "directory"

    def iterdir(self) -> list[RemotePath]:
        return [RemotePath(self.fs, entry["name"], self.protocol, entry.get("type"))
                for entry in self.fs.ls(self.key, detail=True)]

    def open(self, mode: str = "rb", **kwargs: Any) -> IO[Any]:
        """Opened for ranged reads (text modes take encoding and newline, like Path.open)."""
        f: IO[Any] = self.fs.open(self.key, mode, block_size=LINE_BLOCK, cache_type="readahead", **kwargs)
        return f

    def open_ranged(self) -> IO[bytes]:
        """Opened without a cache: each read is one ranged request of what the caller asks (Parquet)."""
        f: IO[bytes] = self.fs.open(self.key, "rb", cache_type="none")
        return f


def source_path(path: Any) -> Any:
    """A source's path as given: a RemotePath stays one, anything else is a pathlib.Path."""
    from pathlib import Path

    return path if isinstance(path, RemotePath) else Path(path)
