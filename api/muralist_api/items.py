"""Work items and determinism: what each output is, and the seed it gets.

The unit of work is an item: one output (an image, or a video) of one row of the job's
source (an inline prompt, a line of promptsFrom, a row of spec.dataset). A row gives
generation.imagesPerPrompt items. Pure and shared by the runtime and the operator's counts.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from muralist_api.job import Generation


def item_key(row: int, image_index: int) -> str:
    """The item's file name stem: `<row>-<image>`, zero-padded so keys of a job sort like items."""
    return f"{row:05d}-{image_index:03d}"


class Shape(NamedTuple):
    """An output's size: what one pipeline call shares (a call renders every item of it at one size)."""

    height: int
    width: int
    num_frames: int | None = None  # None: the pipeline's default (or an image)

    def describe(self) -> str:
        return f"{self.width}x{self.height}" + (f"x{self.num_frames}" if self.num_frames is not None else "")


class Item(BaseModel):
    model_config = ConfigDict(frozen=True)

    row: int
    image_index: int
    prompt: str
    negative_prompt: str | None = None
    seed: int
    id: str | None = None
    # Inputs: a path relative to the inputs volume, or the bytes of an image (a Parquet column).
    image: str | bytes | None = None
    mask: str | bytes | None = None
    strength: float | None = None
    # The row's own size (data-set columns height, width, numFrames); None: the job's (spec.generation).
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    # Why the row could not be read (a seed that is no integer, no prompt): the item fails.
    error: str | None = None

    @property
    def key(self) -> str:
        return item_key(self.row, self.image_index)

    def shape(self, generation: Generation) -> Shape:
        """The size this item renders at: its own where its row gives one, else the job's."""
        return Shape(self.height or generation.height, self.width or generation.width,
                     self.num_frames if self.num_frames is not None else generation.num_frames)

    def number(self, images_per_prompt: int) -> int:
        """The item's place in the whole job (0-based), the order of manifests and galleries."""
        return self.row * images_per_prompt + self.image_index


def text_problem(field: str, text: str | None) -> str | None:
    """Why `text` cannot reach a tokenizer, or None: it must be encodable as UTF-8. A lone surrogate
    (`"\\ud83d"` in JSON: valid JSON, half of an emoji whose other half was cut off) is not."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"{field} is not valid Unicode: a lone surrogate {text[e.start]!a} at character {e.start} (half "
                "of an emoji, cut off?); fix the row's text")
    return None


_CONTROL = dict.fromkeys([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0)])


def printable(text: str) -> str:
    """`text` for places that need valid UTF-8 without control characters (a Parquet column, a PNG
    text chunk, a web page, a log line): lone surrogates and control characters but tab and newline
    become backslash escapes. JSON files keep the text as it is (their escapes are lossless)."""
    if text.isprintable() and text.isascii():
        return text
    escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return escaped.translate({c: f"\\x{c:02x}" for c in _CONTROL})


def item_seed(base_seed: int, row_seed: int | None, row: int, image_index: int, images_per_prompt: int) -> int:
    """An item's seed depends only on the seeds and its indices, never on the world layout.

    A row with its own seed renders image i with seed + i, like a plain diffusers call with that
    seed. Otherwise items are numbered through the job from the base seed.
    """
    if row_seed is not None:
        return row_seed + image_index
    return base_seed + row * images_per_prompt + image_index


def row_items(row: int, prompt: str, generation: Generation, *, negative_prompt: str | None = None,
              seed: int | None = None, id: str | None = None, image: str | bytes | None = None,
              mask: str | bytes | None = None, strength: float | None = None, height: int | None = None,
              width: int | None = None, num_frames: int | None = None, error: str | None = None) -> list[Item]:
    """The imagesPerPrompt items of one row."""
    ipp = generation.images_per_prompt
    return [
        Item(row=row, image_index=i, prompt=prompt, negative_prompt=negative_prompt,
             seed=item_seed(generation.seed, seed, row, i, ipp), id=id, image=image, mask=mask, strength=strength,
             height=height, width=width, num_frames=num_frames, error=error)
        for i in range(ipp)
    ]
