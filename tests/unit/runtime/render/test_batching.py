"""Which items share a pipeline call (render/batching.py): one size a call, in a deterministic order."""

from __future__ import annotations

from muralist_api.items import Item, Shape
from muralist_api.job import Generation
from muralist_runtime.render import batching


def item(row: int, height: int | None = None, width: int | None = None, frames: int | None = None) -> Item:
    return Item(row=row, image_index=0, prompt=f"p{row}", seed=row, height=height, width=width, num_frames=frames)


def test_a_chunk_of_several_sizes_is_rendered_size_by_size() -> None:
    gen = Generation(height=64, width=64, batch_size=2)
    items = [item(0), item(1, 32), item(2), item(3, 32), item(4, 64, 64), item(5, 32), item(6, width=96)]
    batches = batching.shape_batches(items, gen)
    assert [[i.row for i in b] for b in batches] == [[0, 2], [4], [1, 3], [5], [6]], \
        "sizes in the order they first appear (64x64 also where a row says so), rows in order within a size"
    assert [{i.shape(gen) for i in b} for b in batches] == [{Shape(64, 64)}, {Shape(64, 64)}, {Shape(32, 64)},
                                                           {Shape(32, 64)}, {Shape(64, 96)}]


def test_one_size_keeps_the_chunk_order() -> None:
    items = [item(r) for r in range(5)]
    assert batching.shape_batches(items, Generation(batch_size=2)) == [items[0:2], items[2:4], items[4:5]]


def test_frames_are_part_of_the_size() -> None:
    gen = Generation(height=64, width=64, num_frames=17)
    assert {i.shape(gen) for i in (item(0), item(1, frames=9))} == {Shape(64, 64, 17), Shape(64, 64, 9)}
    assert len(batching.shape_batches([item(0), item(1, frames=9), item(2)], gen)) == 3


def test_every_call_has_the_jobs_batch_size() -> None:
    assert batching.call_size(Generation(batch_size=4)) == 4
    assert batching.call_size(Generation(batch_size=1)) is None
