"""The model's plan, made before the world exists: the strategy, the model resolved, the layout
checked against the catalog and the model's config files, its memory estimated (and an Auto plan
confirmed: confirm.py).

Before the world: the world's groups are the plan's group size, and a layout that the model
cannot run is a permanent failure found in seconds, by every rank at once, instead of after
minutes of loading weights.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from muralist_api.runtime_spec import RuntimeSpec

from ..model import resolve, strategies
from ..model.strategies import ParallelStrategy, Plan
from ..world import distributed
from . import confirm

log = logging.getLogger("muralist")


def plan_model(runtime: RuntimeSpec) -> tuple[ParallelStrategy, Plan, str, str | None, bool]:
    """The strategy and its plan, the model's source and revision, and whether it runs on GPUs."""
    spec = runtime.spec
    gpu = distributed.uses_gpu(spec.parallelism)
    if spec.parallelism.gpus_per_node > 0 and not gpu:
        log.warning("spec asks for %d GPUs per node but none is visible: running on CPU",
                    spec.parallelism.gpus_per_node)
    strategy = strategies.get_strategy(spec.parallelism.strategy)
    # Resolved (a tiny model built) before the world exists: see resolve_model.
    source, revision = resolve.resolve_model(runtime)
    plan = strategy.plan(spec, source, revision, gpu)
    # The estimate of this layout (for the job file), and an Auto plan confirmed, still before the world.
    plan = replace(plan, memory_estimate=confirm.confirm(runtime, source, revision, gpu))
    return strategy, plan, source, revision, gpu
