"""Work items and determinism: what each output is, and the seed it gets.

The unit of work is an item: one output (an image, or a video) of one row of the job's
source (an inline prompt, a line of promptsFrom, a row of spec.dataset). A row gives
generation.imagesPerPrompt items. Pure and shared by the runtime and the operator's counts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from muralist_api.job import Generation


def item_key(row: int, image_index: int) -> str:
    """The item's file name stem: `<row>-<image>`, zero-padded so keys of a job sort like items."""
    return f"{row:05d}-{image_index:03d}"


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
    # Why the row could not be read (a seed that is no integer, no prompt): the item fails.
    error: str | None = None

    @property
    def key(self) -> str:
        return item_key(self.row, self.image_index)

    def number(self, images_per_prompt: int) -> int:
        """The item's place in the whole job (0-based), the order of manifests and galleries."""
        return self.row * images_per_prompt + self.image_index


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
              mask: str | bytes | None = None, strength: float | None = None,
              error: str | None = None) -> list[Item]:
    """The imagesPerPrompt items of one row."""
    ipp = generation.images_per_prompt
    return [
        Item(row=row, image_index=i, prompt=prompt, negative_prompt=negative_prompt,
             seed=item_seed(generation.seed, seed, row, i, ipp), id=id, image=image, mask=mask, strength=strength,
             error=error)
        for i in range(ipp)
    ]
