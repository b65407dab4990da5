"""Which items go into one pipeline call: batches of one size and one batch size, in a deterministic order.

A call renders every item of it at one size (height, width, frames), so a chunk whose rows give several
sizes (data-set columns height, width, numFrames) is rendered size by size: the sizes in the order they
first appear in the chunk, each size's items in chunk order, cut into batches of generation.batchSize.

Every call has the job's batch size (`call_size`): a short batch (a chunk's last, a size's last) is padded
with copies of its last item, whose outputs are dropped. An item's seed is its own (items.py), and at one
batch size its pixels do not depend on which items share its call or where it sits in it (measured on the
trained tiny Flux: identical bytes), while another batch size moves a few pixels by one level (33 of 393,216
values over 32 items at 2 against 1). So an item's pixels are the same whatever the world size, the chunks or
the rows around it; and with generation.compile one graph per size serves every call, so nothing compiles
again mid-job. chunks.make_plan cuts chunks whose items fill whole batches, so padding is rare.
"""

from __future__ import annotations

from muralist_api.items import Item, Shape
from muralist_api.job import Generation


def shape_batches(items: list[Item], generation: Generation) -> list[list[Item]]:
    """The items in batches of at most generation.batchSize, each of one size: sizes in order of first
    appearance, items in their order within a size."""
    by_shape: dict[Shape, list[Item]] = {}
    for item in items:
        by_shape.setdefault(item.shape(generation), []).append(item)
    size = generation.batch_size
    return [group[i:i + size] for group in by_shape.values() for i in range(0, len(group), size)]


def call_size(generation: Generation) -> int | None:
    """The batch size every call is padded to (None: one item a call, nothing to pad)."""
    return generation.batch_size if generation.batch_size > 1 else None
