"""The consistency canary (spec.parallelism.verify) for ContextParallel / TensorParallel.

A wrong parallel layout (a model whose CP plan misses a tensor, a backend bug, an uneven
split) does not crash: it renders plausible but wrong images, for hours. Before the job, each
group renders the first task (its prompt and seed, at most CANARY_STEPS steps) twice: first on
the group's first rank alone, with the transformer not yet parallelised (diffusers cannot undo
enable_parallelism, so the reference comes before it), then with the whole group in the
parallel layout. A difference beyond rounding ends the run with the permanent exit code.
A video is compared frame by frame, with the same tolerances over all its pixels.

Every rank of the world learns every group's verdict (one all_gather_object), so all exit
together and none waits on a collective.

Test-only knob: MURALIST_TEST_BREAK_CP=1 gives the group's second rank another seed in the
parallel canary render, so its share of the latents differs: a broken layout.
"""

from __future__ import annotations

import logging
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.contract.env import PodEnv
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec

from ..world.distributed import DistributedWorld
from .call import render

log = logging.getLogger("muralist.canary")

CANARY_STEPS = 2
# Tolerances in 8-bit pixel levels: float reductions in another order (sharded attention)
# move a few pixels by one level; a real layout bug moves many by far more.
MAX_ABS_LEVELS = 2.0
MEAN_ABS_LEVELS = 0.5


def _render(pipe: Any, runtime: RuntimeSpec, task: Item, seed_offset: int = 0) -> Any:
    """The 8-bit pixels of the task's image, or of all its video frames (int16), or None when
    the task itself fails (its input image is missing): then there is nothing to compare."""
    steps = min(CANARY_STEPS, runtime.spec.generation.steps)
    output = render(pipe, runtime, [task], steps=steps, seed_offset=seed_offset)[0]
    return None if output is None else output.pixels()


def reference(pipe: Any, runtime: RuntimeSpec, task: Item, world: DistributedWorld) -> Any:
    """The single-rank render (the group's first rank only; None elsewhere)."""
    if world.layout.group_rank != 0:
        return None
    return _render(pipe, runtime, task)


def difference(ref: Any, got: Any) -> tuple[float, float]:
    """(max, mean) absolute difference in 8-bit levels."""
    import numpy as np

    diff = np.abs(ref.astype(np.int16) - got.astype(np.int16))
    return float(diff.max()), float(diff.mean())


def verdict(ref: Any, got: Any, layout: str) -> str | None:
    worst, mean = difference(ref, got)
    if worst <= MAX_ABS_LEVELS and mean <= MEAN_ABS_LEVELS:
        return None
    return (f"parallel output differs from single-rank output by max {worst:.0f}/255, mean "
            f"{mean:.2f}/255 (tolerance {MAX_ABS_LEVELS:.0f}/255 and {MEAN_ABS_LEVELS}/255; "
            f"layout {layout})")


def check(pipe: Any, runtime: RuntimeSpec, task: Item, world: DistributedWorld, ref: Any,
          layout: str) -> None:
    """Render in the parallel layout (every rank), compare on first ranks, agree everywhere."""
    broken = PodEnv.from_environ().faults.break_cp and world.layout.group_rank == 1
    got = _render(pipe, runtime, task, seed_offset=1 if broken else 0)
    mine = None
    if world.layout.group_rank == 0 and (ref is None or got is None):
        log.warning("verify (group %d): item %s failed on its own (see its reason), nothing to compare",
                    world.layout.group_index, task.key)
    elif ref is not None:
        worst, mean = difference(ref, got)
        log.info("verify (group %d): max %.0f/255, mean %.3f/255", world.layout.group_index,
                 worst, mean)
        mine = verdict(ref, got, f"{layout}, group {world.layout.group_index}")
    verdicts: list[str | None] = [mine]
    if world.distributed:
        import torch.distributed as dist

        verdicts = [None] * world.layout.pg_size
        dist.all_gather_object(verdicts, mine)
    failed = next((v for v in verdicts if v), None)
    if failed:
        raise PermanentFailure("spec.parallelism.verify", failed)
