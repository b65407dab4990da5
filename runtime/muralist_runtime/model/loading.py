"""Loading the pipeline once the world exists: staged, loaded (`from_pretrained` of the source resolve.py
found, with the spec's pipeline class and dtype), checked against the layout and the call, with the
job's features (adapters, scheduler, step cache), VAE tiling when asked, verified by the canary,
parallelised, and what diffusers looks up at every call found once (settled.py). generation.compile comes after,
in compiling.py.

Timings: loadSeconds (staging, from_pretrained, placement, parallel setup, MagCache's calibration
included), calibrateSeconds (that render alone) and verifySeconds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec

from ..step_cache import calibration
from ..world.distributed import DistributedWorld
from . import call, canary, features, hub, settled, staging
from .strategies import ParallelStrategy, Plan

log = logging.getLogger("muralist")


def load(runtime: RuntimeSpec, strategy: ParallelStrategy, plan: Plan, source: str, revision: str | None,
         first: Item, gpu: bool, world: DistributedWorld, timings: dict[str, float],
         learned: dict[str, Any] | None = None) -> Any:
    """The pipeline, ready to render this rank's share; `first`: the canary's, the warm-up's and
    MagCache's calibration item. `learned` receives what the job file records of the model (a
    calibrated cache: `cacheCalibration`)."""
    spec = runtime.spec
    start = time.perf_counter()
    loading = spec.model.loading
    if loading is not None and loading.stage:
        staged, _ = staging.stage_model(source, revision, world.layout.local_rank,
                                        quiet_seconds=spec.parallelism.collective_timeout_seconds)
        source, revision = str(staged), None
    pipe = load_pipeline(runtime, source, revision, **plan.load_kwargs)
    strategy.check_model(pipe, plan)
    call.check_call(pipe, spec)
    pipe = strategy.place(pipe, plan, world)
    # Before the canary's reference and enable_parallelism (features.py says why).
    features.apply_features(pipe, runtime)
    if calibration.wanted(runtime):
        calibrated = time.perf_counter()
        found = calibration.calibrate(pipe, runtime, first, call.render)
        timings["calibrateSeconds"] = time.perf_counter() - calibrated
        if learned is not None:
            learned["cacheCalibration"] = found
    if spec.generation.vae_tiling and not enable_vae_tiling(pipe):
        log.warning("generation.vaeTiling: this pipeline's VAE cannot tile; decoding whole")
    verify = spec.parallelism.verify and world.layout.group_size > 1
    if spec.parallelism.verify and not verify:
        log.info("parallelism.verify: nothing to compare for %s (no parallel group)", spec.parallelism.strategy)
    # The canary's single-rank reference: before enable_parallelism, which cannot be undone.
    reference = canary.reference(pipe, runtime, first, world) if verify else None
    pipe = strategy.parallelize(pipe, plan, world)
    settled.settle(pipe)
    timings["loadSeconds"] = time.perf_counter() - start
    log.info("pipeline loaded in %.1fs", timings["loadSeconds"])
    if verify:
        start = time.perf_counter()
        canary.check(pipe, runtime, first, world, reference, plan.describe())
        timings["verifySeconds"] = time.perf_counter() - start
    return pipe


def pipeline_class(name: str | None) -> Any:
    import diffusers

    if not name:
        return diffusers.DiffusionPipeline
    cls = getattr(diffusers, name, None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise PermanentFailure("spec.model.pipeline", f"diffusers has no pipeline class {name!r}")
    return cls



def load_pipeline(runtime: RuntimeSpec, source: str, revision: str | None, **kwargs: Any) -> Any:
    """`from_pretrained` of `source` (from resolve_model) with the spec's class and dtype."""
    import torch

    model = runtime.spec.model
    cls = pipeline_class(model.pipeline)
    if model.loading is not None and model.loading.no_mmap:
        # diffusers 0.42 takes disable_mmap at the pipeline level and hands it to every
        # component's load_state_dict: safetensors are read whole, not page-faulted in.
        kwargs["disable_mmap"] = True
    with hub.hub_errors(source, revision, hub.MODEL):
        pipe = cls.from_pretrained(source, revision=revision, token=hub.token(), dtype=getattr(torch, model.dtype),
                                   **kwargs)
    # The runtime prints its own progress; diffusers' per-step bars would interleave.
    pipe.set_progress_bar_config(disable=True)
    return pipe



def enable_vae_tiling(pipe: Any) -> bool:
    """Tiled VAE decode. Every rank of a CP/TP group calls the pipeline, so every rank decodes
    with the same tiling and no rank waits on a collective the others skip."""
    vae = getattr(pipe, "vae", None)
    if vae is None or not hasattr(vae, "enable_tiling"):
        return False
    vae.enable_tiling()
    return True
