"""Where the output tree's files land: a local folder (a mounted volume) or object storage.

Every writer works on paths under the job's local output folder (RuntimeSpec.output_dir) and goes
through the storage of that folder (`at(path)`) for the few things that differ:

- `LocalStorage`: today's files. A file is written to a temp name and renamed into place
  (temps.py), so no reader sees a partial one.
- `ObjectStorage` (spec.output.uri, opened by muralist_api.storage.open_location with spec.output.endpoint):
  the local folder is a staging area, and each path under it stands for the object at the same place
  under the URI. An object's PUT is atomic, so a small file
  is put whole (no temp, no rename: Mountpoint-like stores have none), and a streamed one (a shard,
  the index, the manifest) is written to a local temp as before and uploaded once complete.
  A killed writer leaves nothing in the bucket; its local temp goes with the pod.

`mount(runtime)` sets the storage up once per process, from the runtime spec.
"""

from __future__ import annotations

import contextlib
import posixpath
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, Protocol

from muralist_api.runtime_spec import RuntimeSpec
from muralist_api.storage import open_location

from . import temps


class Storage(Protocol):
    """The few operations the output writers and readers need, on paths of the local tree."""

    def write(self, final: Path, data: bytes, fsync: bool = True) -> None:
        """`data` as the whole file `final`, never seen partial."""
        ...

    def publish(self, tmp: Path, final: Path, sync_dir: bool = True) -> None:
        """A complete local temp becomes `final` (the temp is gone after)."""
        ...

    def make_durable(self, paths: Iterable[Path]) -> None:
        """Files written with fsync=False made to outlive a crash of the machine (before a record names them)."""
        ...

    def read_bytes(self, path: Path) -> bytes:
        """The file's bytes; FileNotFoundError when there is none."""
        ...

    def exists(self, path: Path) -> bool: ...

    def open_read(self, path: Path) -> IO[bytes]:
        """The file opened for reading, streamed (a shard read back on resume)."""
        ...

    def names(self, directory: Path) -> list[str]:
        """The names of the files directly in `directory` (none when it does not exist)."""
        ...

    def remove(self, path: Path) -> None:
        """Remove a file if it is there."""
        ...

    def where(self, path: Path) -> str:
        """The path as a reader outside the pod names it (a local path, or a URI)."""
        ...


class LocalStorage:
    """A folder on a volume: temps renamed into place (temps.py)."""

    def write(self, final: Path, data: bytes, fsync: bool = True) -> None:
        temps.write_atomic(final, data, fsync=fsync)

    def make_durable(self, paths: Iterable[Path]) -> None:
        temps.make_durable(paths)

    def publish(self, tmp: Path, final: Path, sync_dir: bool = True) -> None:
        temps.publish(tmp, final, sync_dir=sync_dir)

    def read_bytes(self, path: Path) -> bytes:
        return path.read_bytes()

    def exists(self, path: Path) -> bool:
        return path.is_file()

    def open_read(self, path: Path) -> IO[bytes]:
        return open(path, "rb")

    def names(self, directory: Path) -> list[str]:
        try:
            return [p.name for p in directory.iterdir() if p.is_file()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def where(self, path: Path) -> str:
        return str(path)


class ObjectStorage:
    """Objects under `uri`, standing for the paths under the local staging folder `root`."""

    def __init__(self, root: Path, uri: str, endpoint: str | None = None, options: dict[str, Any] | None = None):
        self.root = root
        self.uri = uri.rstrip("/")
        self.fs, self._prefix = open_location(self.uri, endpoint, options)

    def key(self, path: Path) -> str:
        """The object's path (the URI's, without the protocol) that `path` stands for."""
        relative = path.relative_to(self.root).as_posix()
        return self._prefix if relative == "." else posixpath.join(self._prefix, relative)

    def where(self, path: Path) -> str:
        relative = path.relative_to(self.root).as_posix()
        return self.uri if relative == "." else f"{self.uri}/{relative}"

    def write(self, final: Path, data: bytes, fsync: bool = True) -> None:
        self.fs.pipe_file(self.key(final), data)

    def make_durable(self, paths: Iterable[Path]) -> None:
        return None  # an object is whole and kept once its PUT returned

    def publish(self, tmp: Path, final: Path, sync_dir: bool = True) -> None:
        temps.closed(tmp)
        if not tmp.is_file():
            raise temps.TempRemoved(final)
        self.fs.put_file(str(tmp), self.key(final))
        tmp.unlink(missing_ok=True)

    def read_bytes(self, path: Path) -> bytes:
        try:
            data: bytes = self.fs.cat_file(self.key(path))
        except FileNotFoundError:
            raise
        except IsADirectoryError:
            raise FileNotFoundError(self.where(path)) from None
        return data

    def exists(self, path: Path) -> bool:
        return bool(self.fs.isfile(self.key(path)))

    def open_read(self, path: Path) -> IO[bytes]:
        f: IO[bytes] = self.fs.open(self.key(path), "rb")
        return f

    def names(self, directory: Path) -> list[str]:
        # Listed afresh: other pods add objects meanwhile, and a cached listing would miss them.
        self.fs.invalidate_cache(self.key(directory))
        try:
            found = self.fs.ls(self.key(directory), detail=True)
        except FileNotFoundError:
            return []
        return [posixpath.basename(e["name"].rstrip("/")) for e in found if e.get("type") == "file"]

    def remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.key(path))


_LOCAL = LocalStorage()
_MOUNTED: dict[Path, ObjectStorage] = {}
_LOCK = threading.Lock()


def mount(runtime: RuntimeSpec) -> Storage:
    """The storage of the job's output folder, set up once (spec.output.uri: objects)."""
    root = Path(runtime.output_dir)
    if runtime.output_uri is None:
        return _LOCAL
    with _LOCK:
        if root not in _MOUNTED:
            # No cached listings: other pods add objects, and resume must see them.
            _MOUNTED[root] = ObjectStorage(root, runtime.output_uri, runtime.spec.output.endpoint,
                                           {"use_listings_cache": False})
        return _MOUNTED[root]


def unmount(root: Path) -> None:
    """Forget a mounted folder (tests that run several jobs in one process)."""
    with _LOCK:
        _MOUNTED.pop(Path(root), None)


def at(path: Path) -> Storage:
    """The storage a path of an output tree is in: the object store mounted over one of its
    parents, or the local file system."""
    if _MOUNTED:
        for parent in (path, *path.parents):
            if (found := _MOUNTED.get(parent)) is not None:
                return found
    return _LOCAL
