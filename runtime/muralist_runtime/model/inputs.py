"""Input images of image-conditioned items, decoded: read from spec.inputs (a volume or a uri), or bytes
from a row (work/inputs.py reads them, and keeps their SHA-256 for the item's record).

They are decoded here, on every rank that renders the item, as PIL images: RGB for images, L (grey)
for masks, which is what diffusers' image processors expect.

A missing or unreadable input fails that item alone, with a reason that names the field and
the path (`InputError`); `muralist run` checks the inline prompts' files before loading any
weights (`missing_inline_inputs`), so a typo costs seconds, not a model load.
"""

from __future__ import annotations

import io
from typing import Any

from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec

from ..work.inputs import FIELDS, InputError, read, read_object, resolve

__all__ = ["FIELDS", "MODES", "InputError", "load_input", "load_inputs", "missing_inline_inputs"]

MODES = {"image": "RGB", "mask": "L"}


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


def load_input(runtime: RuntimeSpec, field: str, value: str | bytes) -> Any:
    """One input as a PIL image in its mode (RGB or L)."""
    what = f"({len(value)} bytes from the data set)" if isinstance(value, bytes) else repr(value)
    return _decode(read(runtime, field, value), field, what)


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
                    read_object(runtime, field, value)
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
