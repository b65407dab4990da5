"""Loading the pipeline once the world exists: staged, loaded, checked against the layout, with
the job's features (adapters, scheduler, step cache), verified by the canary, parallelised and,
when asked, compiled.

Timings: loadSeconds (staging, from_pretrained, placement, parallel setup, MagCache's calibration
included), calibrateSeconds (that render alone), verifySeconds and compileSeconds (warm-up included).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec

from ..step_cache import calibration
from ..world.distributed import DistributedWorld
from . import canary, features, pipeline, staging
from .strategies import ParallelStrategy, Plan

log = logging.getLogger("muralist")


def load(runtime: RuntimeSpec, strategy: ParallelStrategy, plan: Plan, source: str, revision: str | None,
         first: Item, gpu: bool, world: DistributedWorld, timings: dict[str, float],
         learned: dict[str, Any] | None = None) -> Any:
    """The pipeline, ready to render this rank's share; `first`: the canary's, the warm-up's and
    MagCache's calibration item. `learned` receives what job.json records of the model (a
    calibrated cache: `cacheCalibration`)."""
    spec = runtime.spec
    start = time.perf_counter()
    loading = spec.model.loading
    if loading is not None and loading.stage:
        staged, _ = staging.stage_model(source, revision, world.layout.local_rank,
                                        quiet_seconds=spec.parallelism.collective_timeout_seconds)
        source, revision = str(staged), None
    pipe = pipeline.load_pipeline(runtime, source, revision, **plan.load_kwargs)
    strategy.check_model(pipe, plan)
    pipeline.check_call(pipe, spec)
    pipe = strategy.place(pipe, plan, world)
    # Before the canary's reference and enable_parallelism (features.py says why).
    features.apply_features(pipe, runtime)
    if calibration.wanted(runtime):
        calibrated = time.perf_counter()
        found = calibration.calibrate(pipe, runtime, first, pipeline.render)
        timings["calibrateSeconds"] = time.perf_counter() - calibrated
        if learned is not None:
            learned["cacheCalibration"] = found
    if spec.generation.vae_tiling and not pipeline.enable_vae_tiling(pipe):
        log.warning("generation.vaeTiling: this pipeline's VAE cannot tile; decoding whole")
    verify = spec.parallelism.verify and world.layout.group_size > 1
    if spec.parallelism.verify and not verify:
        log.info("parallelism.verify: nothing to compare for %s (no parallel group)", spec.parallelism.strategy)
    # The canary's single-rank reference: before enable_parallelism, which cannot be undone.
    reference = canary.reference(pipe, runtime, first, world) if verify else None
    pipe = strategy.parallelize(pipe, plan, world)
    timings["loadSeconds"] = time.perf_counter() - start
    log.info("pipeline loaded in %.1fs", timings["loadSeconds"])
    if verify:
        start = time.perf_counter()
        canary.check(pipe, runtime, first, world, reference, plan.describe())
        timings["verifySeconds"] = time.perf_counter() - start
    if spec.generation.compile:
        compile_and_warm_up(pipe, runtime, first, gpu, world, timings)
    return pipe


def compile_and_warm_up(pipe: Any, runtime: RuntimeSpec, first: Item, gpu: bool, world: DistributedWorld,
                        timings: dict[str, float]) -> None:
    """generation.compile: regional compile, then one call at the job's resolution and batch.

    The warm-up pays the compilation before generateSeconds starts (at the batch size the job
    renders: a batch of another size would compile again at the first real call). On CPU the option is
    accepted and ignored (inductor's CPU codegen needs a compiler toolchain the runtime image
    need not have, and CPU runs are tests and demos).
    """
    if not gpu:
        log.warning("generation.compile: ignored on CPU (GPU only)")
        return
    start = time.perf_counter()
    what = pipeline.compile_transformer(pipe, world.layout.group_size > 1)
    batch = [first] * runtime.spec.generation.batch_size
    pipeline.render(pipe, runtime, batch, steps=min(2, runtime.spec.generation.steps))
    timings["compileSeconds"] = time.perf_counter() - start
    log.info("compiled %s and warmed up in %.1fs", what, timings["compileSeconds"])
