"""The runtime's main path: `python -m muralist_runtime --spec FILE`, one process per rank.

Pods run it under `torchrun -m muralist_runtime --spec ...` (or `accelerate launch -m ...`).
`run` reads as the steps it takes, one function each: check the spec, set up the world, load
the pipeline, plan the work, generate and write, summarise.

Exit codes (the pod contract): 0 done; PERMANENT_FAILURE_EXIT_CODE (78) when retrying cannot
help; anything else (1) is retryable. torchrun replaces a worker's code with its own, so the
verdict also goes to the termination message, where the operator and `muralist run` read it.
Test-only failure injection: knobs.py and canary.py.

Timings: loadSeconds (staging, from_pretrained, placement, parallel setup), verifySeconds,
compileSeconds (warm-up included) and generateSeconds go to the log, job.json and the
termination message.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .spec import contract
from .spec.contract import PERMANENT_FAILURE_EXIT_CODE, Counts, PermanentFailure, Termination
from .spec.items import ImageTask, image_tasks
from .spec.problems import problems_from
from .spec.resolved import RuntimeSpec

log = logging.getLogger("muralist")


def read_spec(path: str) -> RuntimeSpec:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PermanentFailure("--spec", f"cannot read {path}: {e.strerror}") from None
    try:
        return RuntimeSpec.model_validate_json(text)
    except ValidationError as e:
        # The same rules as admission; a spec that slipped past them (written by hand, an
        # older operator) is refused with admission's message, which names the field.
        problems = problems_from(e)
        field_name, _, message = problems[0].partition(": ")
        if not field_name.startswith("spec.") or not message:
            field_name, message = "--spec", f"{path} is not a valid RuntimeSpec: {problems[0]}"
        raise PermanentFailure(field_name, message) from None


def all_prompts(runtime: RuntimeSpec) -> list[Any]:
    """Inline prompts first, then the prompts file's non-blank lines (promptsFrom)."""
    from .spec.api import PromptSpec

    prompts = runtime.spec.prompt_objects
    if runtime.spec.prompts_from is not None:
        if not runtime.prompts_file:
            raise PermanentFailure("spec.promptsFrom", "set, but no prompts file was mounted")
        try:
            lines = Path(runtime.prompts_file).read_text().splitlines()
        except OSError as e:
            raise PermanentFailure("spec.promptsFrom", f"cannot read {runtime.prompts_file}: {e.strerror}") from None
        prompts += [PromptSpec(text=line.strip()) for line in lines if line.strip()]
    if not prompts:
        raise PermanentFailure("spec.prompts", "no prompts to render")
    return prompts


def batches(tasks: Sequence[ImageTask], size: int) -> list[list[ImageTask]]:
    return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]


@dataclass
class Job:
    """What step 1 learned: the spec, the strategy's plan, the images, where the model is."""

    runtime: RuntimeSpec
    strategy: Any  # strategies.ParallelStrategy
    plan: Any  # strategies.Plan
    tasks: list[ImageTask]
    source: str
    revision: str | None
    gpu: bool


@dataclass
class RunState:
    """What a run holds while it goes, so that a failure can still report and clean up."""

    timings: dict[str, float] = field(default_factory=dict)
    world: Any = None
    writer: Any = None
    reporter: Any = None
    progress: Any = None
    background: Any = None

    @property
    def counts(self) -> Counts:
        return self.progress.counts if self.progress is not None else Counts()

    def record_writes(self, knobs: Any = None) -> None:
        """Count the images the writer threads finished: only what is on disk is completed."""
        for done in self.background.completed():
            self.progress.image_done(done.task.key, "completed", done.seconds)
            if knobs is not None:
                knobs.image_written(self.world.layout.rank)

    def finish_writes(self) -> None:
        """On a failure: let queued images reach the disk and count them, raising nothing."""
        if self.background is None:
            return
        self.background.close(raise_error=False)
        if self.progress is not None:
            self.record_writes()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()  # the final counts reach the operator on failures too
        elif self.reporter is not None:
            self.reporter.close()
        if self.world is not None:
            self.world.close()


def _quiet_libraries() -> None:
    # Pods log one line per image; library warnings (experimental APIs, optional torchvision)
    # and per-component loading bars would drown them. Set before the libraries are imported.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()


# 1. Check the spec.
def check_spec(spec_path: str) -> Job:
    from . import pipeline, strategies
    from . import world as worldmod

    runtime = read_spec(spec_path)
    spec = runtime.spec
    gpu = worldmod.has_gpu()
    if spec.parallelism.gpus_per_node > 0 and not gpu:
        log.warning("spec asks for %d GPUs per node but none is visible: running on CPU",
                    spec.parallelism.gpus_per_node)
    strategy = strategies.get_strategy(spec.parallelism.strategy)
    tasks = image_tasks(all_prompts(runtime), spec.generation)
    # Resolved (a tiny model built) before the world exists: see resolve_model.
    source, revision = pipeline.resolve_model(runtime)
    # The layout against the catalog and the model's config files: seconds, not the minutes
    # of loading the weights first.
    plan = strategy.plan(spec, source, revision, gpu)
    return Job(runtime, strategy, plan, tasks, source, revision, gpu)


# 2. Set up the world.
def set_up_world(job: Job, state: RunState) -> None:
    from . import progress
    from . import world as worldmod
    from . import writer as writermod

    state.world = worldmod.setup_world(job.runtime.spec.parallelism, job.plan.group_size)
    layout = state.world.layout
    state.writer = writermod.OutputWriter(job.runtime, layout.rank)
    state.writer.check_existing_job()
    # Heartbeats start now: loading a large model takes minutes, and a silent rank would look
    # stalled to the operator.
    target = progress.kube_target_from_env()
    if target is not None:
        attempt = int(os.environ.get(contract.MURALIST_ATTEMPT, "0"))
        state.reporter = progress.ConfigMapReporter(target, layout.rank, attempt).start()


# 3. Load the pipeline, check that the model supports the layout, and parallelise it.
def load(job: Job, state: RunState) -> Any:
    from . import canary, pipeline, stage

    spec, world, timings = job.runtime.spec, state.world, state.timings
    start = time.perf_counter()
    source, revision = job.source, job.revision
    loading = spec.model.loading
    if loading is not None and loading.stage:
        staged, _ = stage.stage_model(source, revision, world.layout.local_rank)
        source, revision = str(staged), None
    pipe = pipeline.load_pipeline(job.runtime, source, revision, **job.plan.load_kwargs)
    job.strategy.check_model(pipe, job.plan)
    pipeline.check_call(pipe, job.tasks)
    pipe = job.strategy.place(pipe, job.plan, world)
    if spec.generation.vae_tiling and not pipeline.enable_vae_tiling(pipe):
        log.warning("generation.vaeTiling: this pipeline's VAE cannot tile; decoding whole")
    verify = spec.parallelism.verify and world.layout.group_size > 1
    if spec.parallelism.verify and not verify:
        log.info("parallelism.verify: nothing to compare for %s (no parallel group)", spec.parallelism.strategy)
    # The canary's single-rank reference: before enable_parallelism, which cannot be undone.
    reference = canary.reference(pipe, job.runtime, job.tasks[0], world) if verify else None
    pipe = job.strategy.parallelize(pipe, job.plan, world)
    timings["loadSeconds"] = time.perf_counter() - start
    log.info("pipeline loaded in %.1fs", timings["loadSeconds"])
    if verify:
        start = time.perf_counter()
        canary.check(pipe, job.runtime, job.tasks[0], world, reference, job.plan.describe())
        timings["verifySeconds"] = time.perf_counter() - start
    if spec.generation.compile:
        compile_and_warm_up(pipe, job, state)
    return pipe


def compile_and_warm_up(pipe: Any, job: Job, state: RunState) -> None:
    """generation.compile: regional compile, then one call at the job's resolution.

    The warm-up pays the compilation before generateSeconds starts. On CPU the option is
    accepted and ignored (inductor's CPU codegen needs a compiler toolchain the runtime image
    need not have, and CPU runs are tests and demos).
    """
    from . import pipeline

    if not job.gpu:
        log.warning("generation.compile: ignored on CPU (GPU only)")
        return
    start = time.perf_counter()
    what = pipeline.compile_transformer(pipe, state.world.layout.group_size > 1)
    pipeline.render(pipe, job.runtime, [job.tasks[0]], steps=min(2, job.runtime.spec.generation.steps))
    state.timings["compileSeconds"] = time.perf_counter() - start
    log.info("compiled %s and warmed up in %.1fs", what, state.timings["compileSeconds"])


# 4. Plan the work: this group's images, minus those already on disk. Every rank looks after
# the same barrier, before anyone writes, so a group's ranks agree on the list.
def plan_work(job: Job, state: RunState) -> list[ImageTask]:
    from . import assign, progress

    world, writer = state.world, state.writer
    layout = world.layout
    share = assign.plan_for_rank(job.tasks, layout)
    if layout.rank == 0:
        writer.prepare()
        writer.write_job(layout.describe())
    world.barrier()
    done = [t for t in share if writer.is_complete(t)]
    local = os.environ.get(contract.MURALIST_LOCAL) == "1"
    rank_file = progress.RankFile(progress.progress_dir(), layout.rank)
    state.progress = progress.Progress(layout.rank, len(share), layout.writes_images, local=local,
                                       reporter=state.reporter, rank_file=rank_file)
    for task in done:
        if layout.writes_images:
            writer.log(task, "skipped")
        state.progress.image_done(task.key, "skipped", 0.0)
    return [t for t in share if not writer.is_complete(t)]


# 5. Generate and 6. write (only a group's first rank writes; all render). Writer threads encode
# and write while the next image renders; an image counts once it is on disk.
def generate(job: Job, pipe: Any, pending: list[ImageTask], state: RunState) -> None:
    from . import pipeline
    from . import writer as writermod
    from .knobs import TestKnobs

    layout, prog = state.world.layout, state.progress
    knobs = TestKnobs.from_env()
    start = time.perf_counter()
    if layout.writes_images:
        state.background = writermod.BackgroundWriter(state.writer.write_image)
    for batch in batches(pending, job.runtime.spec.generation.batch_size):
        t0 = time.perf_counter()
        images = pipeline.render(pipe, job.runtime, batch, on_step=prog.step_done)
        seconds = (time.perf_counter() - t0) / len(batch)
        if state.background is None:
            continue  # the group's other ranks hold the same images: nothing to write or count
        for task, image in zip(batch, images, strict=True):
            state.background.submit(task, image, seconds)
        if knobs.active:
            state.background.wait_idle()
        state.record_writes(knobs)
    if state.background is not None:
        state.background.close()  # drains the queue; raises a write error
        state.record_writes(knobs)
    state.timings["generateSeconds"] = time.perf_counter() - start
    log.info("generated %d images in %.1fs (load %.1fs)", len(pending), state.timings["generateSeconds"],
             state.timings["loadSeconds"])


# 7. Summarise: rank 0 merges the manifests once every rank has written.
def summarise(job: Job, state: RunState) -> None:
    world, writer = state.world, state.writer
    world.barrier()
    if world.layout.rank == 0:
        entries = writer.merge_manifest(job.tasks)
        gallery = writer.write_gallery(entries)
        writer.write_job(world.layout.describe(), state.timings)
        log.info("%d of %d images in %s", len(entries), len(job.tasks), gallery)


def run(spec_path: str) -> int:
    from .termination import write_termination

    state = RunState()
    try:
        _quiet_libraries()
        job = check_spec(spec_path)
        set_up_world(job, state)
        pipe = load(job, state)
        pending = plan_work(job, state)
        generate(job, pipe, pending, state)
        summarise(job, state)
        if state.world.layout.local_rank == 0:
            write_termination(Termination(state.counts, timings=state.timings))
        return contract.EXIT_OK
    except PermanentFailure as e:
        print(f"muralist: {e}", file=sys.stderr, flush=True)
        state.finish_writes()
        write_termination(Termination(state.counts, PERMANENT_FAILURE_EXIT_CODE, True, "PermanentFailure", str(e),
                                      state.timings))
        return PERMANENT_FAILURE_EXIT_CODE
    except Exception as e:
        traceback.print_exc()
        state.finish_writes()
        message = f"{type(e).__name__}: {e}".splitlines()[0]
        write_termination(Termination(state.counts, contract.EXIT_RETRYABLE, False, "Error", message, state.timings))
        return contract.EXIT_RETRYABLE
    finally:
        state.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="muralist_runtime", description="Render this rank's share of a DiffusionJob.")
    parser.add_argument("--spec", required=True, help="RuntimeSpec JSON file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    return run(args.spec)
