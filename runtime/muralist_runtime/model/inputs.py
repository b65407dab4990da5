"""Input images of image-conditioned items: read from spec.inputs (a volume or a uri), or bytes from a row.

An item's `image` / `mask` is a path relative to the inputs volume (RuntimeSpec.inputs_dir,
mounted read-only) or to the inputs' prefix in object storage (RuntimeSpec.inputs_uri: each input
is one GET, when its item renders), or the encoded bytes of an image (a Parquet binary column, a datasets
Image feature). They are decoded here, on every rank that renders the item, as PIL images:
RGB for images, L (grey) for masks, which is what diffusers' image processors expect.

A missing or unreadable input fails that item alone, with a reason that names the field and
the path (`InputError`); `muralist run` checks the inline prompts' files before loading any
weights (`missing_inline_inputs`), so a typo costs seconds, not a model load.
"""

from __future__ import annotations

import functools
import io
import re
from pathlib import Path
from typing import Any

from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec
from muralist_api.storage import join_uri, storage_options

FIELDS = ("image", "mask")  # Item fields, and their names in the spec
MODES = {"image": "RGB", "mask": "L"}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


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


def _decode(data: bytes, field: str, what: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert(MODES[field])
    except UnidentifiedImageError:
        raise InputError(f"{field} {what} is not a readable image (not a format Pillow knows)") from None
    except (OSError, ValueError) as e:  # a truncated or corrupt file of a known format
        raise InputError(f"{field} {what} is not a readable image ({type(e).__name__}: {e})".splitlines()[0]) from None


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
    import fsspec

    fs, _ = fsspec.core.url_to_fs(uri, **storage_options(uri, endpoint))
    return fs


def _read_object(runtime: RuntimeSpec, field: str, value: str) -> bytes:
    uri = runtime.inputs_uri
    assert uri is not None
    inputs = runtime.spec.inputs
    fs = _object_store(uri, inputs.endpoint if inputs is not None else None)
    target = join_uri(uri, _relative(field, value))
    try:
        data: bytes = fs.cat_file(target)
    except FileNotFoundError:
        raise InputError(f"{field} {value!r} not found in spec.inputs.uri ({uri})") from None
    except IsADirectoryError:
        raise InputError(f"{field} {value!r} is a prefix in spec.inputs.uri, not an image") from None
    except OSError as e:
        raise InputError(f"{field} {value!r} cannot be read from spec.inputs.uri: {e.strerror or e}") from None
    return data


def load_input(runtime: RuntimeSpec, field: str, value: str | bytes) -> Any:
    """One input as a PIL image in its mode (RGB or L)."""
    if isinstance(value, bytes):
        return _decode(value, field, f"({len(value)} bytes from the data set)")
    if runtime.inputs_uri:
        return _decode(_read_object(runtime, field, value), field, repr(value))
    path = resolve(runtime.inputs_dir, field, value)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{field} {value!r} not found in spec.inputs.volume") from None
    except IsADirectoryError:
        raise InputError(f"{field} {value!r} is a directory in spec.inputs.volume, not an image") from None
    except OSError as e:
        raise InputError(f"{field} {value!r} cannot be read from spec.inputs.volume: {e.strerror or e}") from None
    return _decode(data, field, repr(value))


def load_inputs(runtime: RuntimeSpec, item: Item) -> dict[str, Any]:
    """{"image": PIL RGB, "mask": PIL L} for the inputs the item has (empty for text-only items)."""
    out = {}
    for field in FIELDS:
        value = getattr(item, field)
        if value is not None:
            out[field] = load_input(runtime, field, value)
    return out


def missing_inline_inputs(runtime: RuntimeSpec) -> list[str]:
    """Problems with the inline prompts' input files ("spec.prompts[2].image: ..."), checked
    before anything loads; a data set's rows are checked as they are rendered."""
    problems = []
    for index, prompt in enumerate(runtime.spec.prompt_objects):
        for field in FIELDS:
            value = getattr(prompt, field)
            if value is None:
                continue
            where = f"spec.prompts[{index}].{field}"
            if runtime.inputs_uri:
                try:
                    _read_object(runtime, field, value)
                except InputError as e:
                    problems.append(f"{where}: {e}")
                continue
            try:
                path = resolve(runtime.inputs_dir, field, value)
            except InputError as e:
                problems.append(f"{where}: {e}")
                continue
            if not path.is_file():
                problems.append(f"{where}: {value!r} not found in spec.inputs.volume ({runtime.inputs_dir})")
    return problems
