"""The DataParallel shard plan: pure, balanced, every image exactly once."""

from __future__ import annotations

import pytest
from muralist_runtime.assign import plan_for_rank, shard
from muralist_runtime.spec.api import Generation, PromptSpec
from muralist_runtime.spec.items import image_tasks
from muralist_runtime.world import Layout


def layout(rank: int, world: int, group: int = 1, per_node: int | None = None) -> Layout:
    per_node = per_node or world
    return Layout(rank=rank, world_size=world, local_rank=rank % per_node,
                  local_world_size=per_node, node_rank=rank // per_node, group_size=group)


def tasks(prompts: int, per_prompt: int = 1, seed: int = 0):
    return image_tasks([PromptSpec(text=f"p{i}") for i in range(prompts)],
                       Generation(images_per_prompt=per_prompt, seed=seed))


@pytest.mark.parametrize(
    ("n", "parts", "sizes"),
    [
        (3, 2, [2, 1]),
        (6, 2, [3, 3]),
        (7, 3, [3, 2, 2]),
        (1, 4, [1, 0, 0, 0]),
        (0, 2, [0, 0]),
        (10, 1, [10]),
        (5, 5, [1, 1, 1, 1, 1]),
    ],
)
def test_shard_is_balanced_contiguous_and_exact(n: int, parts: int, sizes: list[int]) -> None:
    chunks = shard(list(range(n)), parts)
    assert [len(c) for c in chunks] == sizes
    assert max(sizes) - min(sizes) <= 1
    assert [x for c in chunks for x in c] == list(range(n)), "each once, in order, no padding"


def test_shard_refuses_zero_parts() -> None:
    with pytest.raises(ValueError):
        shard([1], 0)


@pytest.mark.parametrize(
    ("prompts", "per_prompt", "world", "group", "expected"),
    [
        # 3 prompts on 2 ranks.
        (3, 1, 2, 1, {0: ["00000-000", "00001-000"], 1: ["00002-000"]}),
        # 2 groups of 2 (ContextParallel 2 on 4 ranks): both ranks of a group get its images.
        (2, 2, 4, 2, {0: ["00000-000", "00000-001"], 1: ["00000-000", "00000-001"],
                      2: ["00001-000", "00001-001"], 3: ["00001-000", "00001-001"]}),
        # one group holding the whole world
        (2, 1, 2, 2, {0: ["00000-000", "00001-000"], 1: ["00000-000", "00001-000"]}),
    ],
)
def test_plan_per_rank(prompts, per_prompt, world, group, expected) -> None:
    all_tasks = tasks(prompts, per_prompt)
    got = {r: [t.key for t in plan_for_rank(all_tasks, layout(r, world, group))]
           for r in range(world)}
    assert got == expected


@pytest.mark.parametrize(("world", "group"),
                         [(w, g) for w in (1, 2, 3, 4, 5, 8) for g in (1, 2) if w % g == 0])
def test_union_of_group_plans_is_every_image_once(world: int, group: int) -> None:
    all_tasks = tasks(7, 3)
    leaders = [r for r in range(world) if r % group == 0]
    planned = [t for r in leaders for t in plan_for_rank(all_tasks, layout(r, world, group))]
    assert sorted(planned, key=lambda t: t.key) == all_tasks
    sizes = [len(plan_for_rank(all_tasks, layout(r, world, group))) for r in leaders]
    assert max(sizes) - min(sizes) <= 1


def test_seeds_do_not_depend_on_world_size() -> None:
    all_tasks = tasks(5, 2, seed=100)
    by_world = {}
    for world in (1, 2, 3, 4):
        by_world[world] = sorted(
            (t.key, t.seed) for r in range(world) for t in plan_for_rank(all_tasks, layout(r, world))
        )
    assert all(v == by_world[1] for v in by_world.values())
    assert by_world[1][:3] == [("00000-000", 100), ("00000-001", 101), ("00001-000", 102)]


def test_layout_groups() -> None:
    lay = layout(rank=5, world=8, group=2, per_node=4)
    assert (lay.group_index, lay.group_rank, lay.dp_degree, lay.nodes) == (2, 1, 4, 2)
    assert not lay.writes_images
    assert layout(4, 8, 2, 4).writes_images
