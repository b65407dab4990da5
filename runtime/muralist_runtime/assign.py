"""Which images each rank renders: the static shard plan."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from .spec.items import ImageTask
from .world import Layout

T = TypeVar("T")


def shard(items: Sequence[T], parts: int) -> list[list[T]]:
    """Split into `parts` contiguous chunks whose sizes differ by at most one.

    The first chunks get the extra items (like accelerate's split_between_processes), and
    nothing is padded or repeated: each item lands in exactly one chunk.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(len(items), parts)
    out: list[list[T]] = []
    start = 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out


def plan_for_rank(tasks: Sequence[ImageTask], layout: Layout) -> list[ImageTask]:
    """The images of this rank's data-parallel group (all ranks of a group render them all)."""
    return shard(tasks, layout.dp_degree)[layout.group_index]
