"""Thumbnails of an item's inputs, kept beside its output so that the gallery can show them."""

from __future__ import annotations

import io
from typing import Any

THUMBNAIL_SIDE = 256  # at most this many pixels a side


def thumbnail_jpeg(image: Any) -> bytes:
    """A small JPEG of an input (the gallery shows it beside the output); deterministic bytes."""
    small = image.copy()
    small.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
    buffer = io.BytesIO()
    small.convert("L" if small.mode == "L" else "RGB").save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()
