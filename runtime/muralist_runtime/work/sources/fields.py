"""What a row holds: the column mapping (`Columns`), one item's fields (`Row`), and parsing them.

Readers yield records (a mapping of column to raw value, or `_Bad` for a line that could not
be split into fields); `_make_row` turns one into a `Row`, converting and validating each
mapped value. A bad value makes that row failed (`error` set), never the whole source.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

# torch.Generator.manual_seed takes int64; seed + image index must stay in range too.
SEED_MAX = 2**63 - 1
_INT = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class Columns:
    """Which column (JSON key, CSV header, Parquet/Arrow field) holds what; None = absent.

    `prompt`, `image` and `mask` are required in every row once mapped; the others are optional
    per row (a missing or empty value is None).
    """

    prompt: str | None = "prompt"
    negative_prompt: str | None = None
    seed: str | None = None
    image: str | None = None
    mask: str | None = None
    strength: str | None = None
    id: str | None = None
    height: str | None = None
    width: str | None = None
    num_frames: str | None = None

    def mapped(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class Row:
    """One item's raw fields. `index` is its position in the whole source (0-based).

    `image`/`mask` are a path or URL as written in the source (resolving is the caller's job),
    or encoded image bytes (a binary column, or the `bytes` of a datasets `Image` feature).
    A row that failed validation has `error` set and `prompt` "": the item is failed, not the job.
    """

    index: int
    id: str | None
    prompt: str
    negative_prompt: str | None = None
    seed: int | None = None
    image: str | bytes | None = None
    mask: str | bytes | None = None
    strength: float | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class _Bad:
    """A record that could not even be split into fields (invalid JSON, wrong field count)."""

    reason: str


Record = Mapping[str, Any] | _Bad


_MISSING = object()


def _make_row(index: int, record: Record, columns: Columns) -> Row:
    if isinstance(record, _Bad):
        return Row(index=index, id=None, prompt="", error=record.reason)
    errors: list[str] = []
    values: dict[str, Any] = {}
    for field, column in columns.mapped().items():
        value = record.get(column, _MISSING)
        try:
            values[field] = _CONVERT[field](value)
        except _Invalid as e:
            errors.append(f"column {column!r}: {e}")
    if errors:
        return Row(index=index, id=values.get("id"), prompt="", error="; ".join(errors))
    return Row(index=index, prompt=values.pop("prompt", ""), id=values.pop("id", None), **values)


class _Invalid(ValueError):
    pass


def _absent(value: Any) -> bool:
    return value is _MISSING or value is None or (isinstance(value, str) and not value.strip())


def _prompt(value: Any) -> str:
    if value is _MISSING:
        raise _Invalid("missing")
    if not isinstance(value, str):
        raise _Invalid(f"prompt is {'null' if value is None else 'a ' + type(value).__name__}, not a string")
    if not value.strip():
        raise _Invalid("empty prompt")
    return value


def _optional_text(value: Any) -> str | None:
    if _absent(value):
        return None
    if not isinstance(value, str):
        raise _Invalid(f"a {type(value).__name__}, not a string")
    return value


def _id(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _optional_text(value)


def _seed(value: Any) -> int | None:
    if _absent(value) or (isinstance(value, float) and math.isnan(value)):
        return None  # NaN: pandas writes a missing integer as a float NaN
    if isinstance(value, bool):
        raise _Invalid(f"seed {value!r} is not an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise _Invalid(f"seed {value!r} is not an integer")
        value = int(value)
    elif isinstance(value, str):
        if not _INT.fullmatch(value.strip()):
            raise _Invalid(f"seed {value!r} is not an integer")
        value = int(value)
    elif not isinstance(value, int):
        raise _Invalid(f"seed is a {type(value).__name__}, not an integer")
    if not 0 <= value <= SEED_MAX:
        raise _Invalid(f"seed {value} is outside 0..2^63-1")
    return int(value)


def _strength(value: Any) -> float | None:
    if _absent(value) or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _Invalid(f"strength {value!r} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise _Invalid(f"strength {value!r} is not a number") from None
    if not 0.0 <= number <= 1.0:
        raise _Invalid(f"strength {number} is outside 0..1")
    return number


# What spec.generation allows for height, width and numFrames (api/muralist_api/generation.py).
SIZE_MAX, SIZE_MULTIPLE, FRAMES_MAX = 16384, 8, 1025


def _whole(value: Any, what: str) -> int | None:
    """A whole number or None (absent); a float that is one counts (pandas writes integer columns with a
    missing value as floats)."""
    if _absent(value) or (isinstance(value, float) and math.isnan(value)):
        return None
    if (isinstance(value, float) and value.is_integer()) or (isinstance(value, str) and _INT.fullmatch(value.strip())):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"{what} {value!r} is not a whole number")
    return value


def _size(what: str) -> Any:
    def convert(value: Any) -> int | None:
        size = _whole(value, what)
        if size is not None and not (SIZE_MULTIPLE <= size <= SIZE_MAX and size % SIZE_MULTIPLE == 0):
            raise _Invalid(f"{what} {size} is not a multiple of {SIZE_MULTIPLE} in {SIZE_MULTIPLE}..{SIZE_MAX}")
        return size
    return convert


def _frames(value: Any) -> int | None:
    frames = _whole(value, "numFrames")
    if frames is not None and not 1 <= frames <= FRAMES_MAX:
        raise _Invalid(f"numFrames {frames} is outside 1..{FRAMES_MAX}")
    return frames


def _image(value: Any) -> str | bytes:
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        value = value.get("bytes") or value.get("path")  # a datasets Image feature, undecoded
    if isinstance(value, bytes | bytearray | memoryview):
        if not value:
            raise _Invalid("empty image bytes")
        return bytes(value)
    if _absent(value):
        raise _Invalid("missing")
    if not isinstance(value, str):
        raise _Invalid(f"a {type(value).__name__}, not a path, URL or image bytes")
    return value


_CONVERT = {"prompt": _prompt, "negative_prompt": _optional_text, "seed": _seed, "image": _image,
            "mask": _image, "strength": _strength, "id": _id, "height": _size("height"), "width": _size("width"),
            "num_frames": _frames}
