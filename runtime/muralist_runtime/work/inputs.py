"""An item's input images as bytes: where they are read from, and their SHA-256 for the item's request digest.

An item's `image` / `mask` is a path relative to the inputs volume (RuntimeSpec.inputs_dir, mounted
read-only) or to the inputs' prefix in object storage (RuntimeSpec.inputs_uri: each input is one GET),
or the encoded bytes of an image (a Parquet binary column, a datasets Image feature). model/inputs.py
decodes what `read` returns; the request digest (muralist_api/contract/resume.py) takes the SHA-256 of
the same bytes, so a replaced photo is a changed request.

Hashing every input again to check a kept item would read a whole catalogue of photos on every resume,
so an item's record keeps each input's stamp (its size and modification time, or an object's ETag)
beside its SHA-256: an input whose stamp is unchanged is taken to hold the same bytes, as rsync and git
take an unchanged file (`shas`). The SHA-256 of what this process read last is remembered (`remember`),
so the record of an item just rendered costs no second read.

A missing or unreadable input is the item's failure (`InputError`, naming the field and the path).
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec
from muralist_api.storage import join_uri, open_location

FIELDS = ("image", "mask")  # Item fields, and their names in the spec
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Inputs read by this process whose SHA-256 is remembered (an item's record is written a few items
# after its inputs are read: the writer threads' queue).
REMEMBERED = 4096


class InputError(Exception):
    """An item's input that cannot be used; the message names the field and the path."""


def resolve(inputs_dir: str | None, field: str, path: str) -> Path:
    """The file an input path names inside the inputs volume, or InputError saying why not."""
    if _SCHEME.match(path):
        raise InputError(f"{field} {path!r} is a URL; inputs are read from spec.inputs.volume only: put the file "
                         "there and give its relative path")
    if not inputs_dir:
        raise InputError(f"{field} {path!r} names a file, but no spec.inputs.volume is mounted")
    root = Path(inputs_dir).resolve()
    target = (root / path).resolve()
    if path.startswith("/") or not target.is_relative_to(root):
        raise InputError(f"{field} {path!r} is not a relative path inside spec.inputs.volume")
    return target


def _relative(field: str, path: str) -> str:
    """An input path that stays under the inputs' prefix, or InputError saying why not."""
    if _SCHEME.match(path):
        raise InputError(f"{field} {path!r} is a URL; inputs are read from spec.inputs only: put the object "
                         "under spec.inputs.uri and give its path relative to it")
    if path.startswith("/") or ".." in path.split("/"):
        raise InputError(f"{field} {path!r} is not a relative path inside spec.inputs.uri")
    return path


@functools.cache
def _object_store(uri: str, endpoint: str | None) -> Any:
    fs, _ = open_location(uri, endpoint)
    return fs


def _remote(runtime: RuntimeSpec, field: str, value: str) -> tuple[Any, str]:
    uri = runtime.inputs_uri
    assert uri is not None
    inputs = runtime.spec.inputs
    return _object_store(uri, inputs.endpoint if inputs is not None else None), join_uri(uri, _relative(field, value))


def read_object(runtime: RuntimeSpec, field: str, value: str) -> bytes:
    fs, target = _remote(runtime, field, value)
    uri = runtime.inputs_uri
    try:
        data: bytes = fs.cat_file(target)
    except FileNotFoundError:
        raise InputError(f"{field} {value!r} not found in spec.inputs.uri ({uri})") from None
    except IsADirectoryError:
        raise InputError(f"{field} {value!r} is a prefix in spec.inputs.uri, not an image") from None
    except OSError as e:
        raise InputError(f"{field} {value!r} cannot be read from spec.inputs.uri: {e.strerror or e}") from None
    return data


def read(runtime: RuntimeSpec, field: str, value: str | bytes) -> bytes:
    """One input's bytes (remembered with their SHA-256 and stamp for the item's record)."""
    if isinstance(value, bytes):
        return value
    stamp = _stamp(runtime, field, value)
    if runtime.inputs_uri:
        data = read_object(runtime, field, value)
    else:
        path = resolve(runtime.inputs_dir, field, value)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{field} {value!r} not found in spec.inputs.volume") from None
        except IsADirectoryError:
            raise InputError(f"{field} {value!r} is a directory in spec.inputs.volume, not an image") from None
        except OSError as e:
            raise InputError(f"{field} {value!r} cannot be read from spec.inputs.volume: {e.strerror or e}") from None
    _REMEMBERED.put((field, value), InputSha(hashlib.sha256(data).hexdigest(), stamp))
    return data


def _stamp(runtime: RuntimeSpec, field: str, value: str) -> str | None:
    """What changes when an input's bytes do, without reading them: size and modification time (ns) of
    a file, size and ETag (or modification time) of an object; None when it cannot be told."""
    try:
        if runtime.inputs_uri:
            fs, target = _remote(runtime, field, value)
            info = fs.info(target)
            tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime")
            return f"{info.get('size')}:{tag}" if tag is not None else None
        stat = resolve(runtime.inputs_dir, field, value).stat()
        return f"{stat.st_size}:{stat.st_mtime_ns}"
    except (OSError, InputError):
        return None


class InputSha:
    """An input's SHA-256 (hex) and the stamp its bytes had (None: not known)."""

    __slots__ = ("sha256", "stamp")

    def __init__(self, sha256: str, stamp: str | None):
        self.sha256, self.stamp = sha256, stamp

    def to_json(self) -> dict[str, str]:
        return {"sha256": self.sha256, **({"stamp": self.stamp} if self.stamp is not None else {})}


class _Remembered:
    """The last inputs this process read, with their SHA-256 (thread-safe: the writer threads read it)."""

    def __init__(self, size: int):
        self._items: OrderedDict[tuple[str, str], InputSha] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def put(self, key: tuple[str, str], value: InputSha) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def get(self, key: tuple[str, str]) -> InputSha | None:
        with self._lock:
            return self._items.get(key)


_REMEMBERED = _Remembered(REMEMBERED)


def shas(runtime: RuntimeSpec, item: Item, recorded: Mapping[str, Any] | None = None) -> dict[str, InputSha]:
    """The SHA-256 of each input the item has: of bytes from the data set directly; of a file or object,
    as this process last read it, or as its record says when its stamp is unchanged (`recorded`: the
    record's `inputs`), else read again. Raises InputError when an input cannot be read."""
    out: dict[str, InputSha] = {}
    for field in FIELDS:
        value = getattr(item, field)
        if value is None:
            continue
        if isinstance(value, bytes):
            out[field] = InputSha(hashlib.sha256(value).hexdigest(), None)
            continue
        known = _REMEMBERED.get((field, value))
        before = (recorded or {}).get(field)
        stamp = _stamp(runtime, field, value)
        if known is not None and known.stamp is not None and known.stamp == stamp:
            out[field] = known
        elif isinstance(before, dict) and stamp is not None and before.get("stamp") == stamp \
                and isinstance(before.get("sha256"), str):
            out[field] = InputSha(before["sha256"], stamp)
        else:
            read(runtime, field, value)
            remembered = _REMEMBERED.get((field, value))
            assert remembered is not None
            out[field] = remembered
    return out
