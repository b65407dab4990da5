"""The runtime's main path: `python -m muralist_runtime --spec FILE`, one process per rank.

Pods run it under `torchrun -m muralist_runtime --spec ...` (or `accelerate launch -m ...`).
It reads as the steps it takes: check the spec, set up the world, load the pipeline, plan
shards, generate and write, summarise.

Exit codes: 0 done; spec.PERMANENT_FAILURE_EXIT_CODE (78) when retrying cannot help; anything
else (1) is retryable. torchrun replaces a worker's code with its own, so the verdict also goes
to the termination message (progress.write_termination), where the operator and
`muralist run` read it.

Test-only knobs (TestKnobs): MURALIST_TEST_EXIT_AFTER=N makes a rank (MURALIST_TEST_EXIT_RANK,
default 0) `os._exit(17)` right after writing its N-th image, standing in for a killed pod;
MURALIST_TEST_HANG_AFTER=N makes a rank (MURALIST_TEST_HANG_RANK, default 0) block forever
after its N-th image, standing in for a stuck rank (its heartbeat goes on, its lastStepTime
stops). With either set, each image is written before the next is rendered (deterministic).
MURALIST_TEST_BREAK_CP: see canary.py.

Timings: loadSeconds (staging, from_pretrained, placement, parallel setup), verifySeconds,
compileSeconds (warm-up included) and generateSeconds go to the log, job.json and the
termination message.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .spec import (
    PERMANENT_FAILURE_EXIT_CODE,
    ImageTask,
    PermanentFailure,
    PromptSpec,
    RuntimeSpec,
    image_tasks,
    problems_from,
)

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
        field, _, message = problems[0].partition(": ")
        if not field.startswith("spec.") or not message:
            field, message = "--spec", f"{path} is not a valid RuntimeSpec: {problems[0]}"
        raise PermanentFailure(field, message) from None


def all_prompts(runtime: RuntimeSpec) -> list[PromptSpec]:
    """Inline prompts first, then the prompts file's non-blank lines (promptsFrom)."""
    prompts = runtime.spec.prompt_objects
    if runtime.spec.prompts_from is not None:
        if not runtime.prompts_file:
            raise PermanentFailure("spec.promptsFrom", "set, but no prompts file was mounted")
        try:
            lines = Path(runtime.prompts_file).read_text().splitlines()
        except OSError as e:
            raise PermanentFailure("spec.promptsFrom",
                                   f"cannot read {runtime.prompts_file}: {e.strerror}") from None
        prompts += [PromptSpec(text=line.strip()) for line in lines if line.strip()]
    if not prompts:
        raise PermanentFailure("spec.prompts", "no prompts to render")
    return prompts


def batches(tasks: Sequence[ImageTask], size: int) -> list[list[ImageTask]]:
    return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]


@dataclass
class TestKnobs:
    """The MURALIST_TEST_* failure injections (documented in the module docstring)."""

    exit_after: int = 0
    exit_rank: int = 0
    hang_after: int = 0
    hang_rank: int = 0
    written: int = 0

    @classmethod
    def from_env(cls) -> TestKnobs:
        def num(name: str) -> int:
            return int(os.environ.get(name, "0") or 0)

        return cls(num("MURALIST_TEST_EXIT_AFTER"), num("MURALIST_TEST_EXIT_RANK"),
                   num("MURALIST_TEST_HANG_AFTER"), num("MURALIST_TEST_HANG_RANK"))

    @property
    def active(self) -> bool:
        return bool(self.exit_after or self.hang_after)

    def image_written(self, rank: int) -> None:
        self.written += 1
        if self.exit_after and self.written == self.exit_after and rank == self.exit_rank:
            os._exit(17)
        if self.hang_after and self.written == self.hang_after and rank == self.hang_rank:
            log.warning("MURALIST_TEST_HANG_AFTER=%d: rank %d blocks forever", self.hang_after,
                        rank)
            threading.Event().wait()


def record_writes(bg: Any, prog: Any, knobs: TestKnobs | None, rank: int) -> None:
    """Count the images the writer threads finished: only what is on disk is completed."""
    for done in bg.completed():
        prog.image_done(done.task.key, "completed", done.seconds)
        if knobs is not None:
            knobs.image_written(rank)


def finish_writes(bg: Any, prog: Any) -> None:
    """On a failure: let queued images reach the disk and count them, raising nothing."""
    if bg is None:
        return
    bg.close(raise_error=False)
    if prog is not None:
        record_writes(bg, prog, None, 0)


def _quiet_libraries() -> None:
    # Pods log one line per image; library warnings (experimental APIs, optional torchvision)
    # and per-component loading bars would drown them. Set before the libraries are imported.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()


def run(spec_path: str) -> int:
    from . import canary, pipeline, progress, stage, strategies
    from . import world as worldmod
    from . import writer as writermod

    counts = progress.Counts()
    world = None
    prog = None
    reporter = None
    bg = None
    timings: dict[str, float] = {}
    try:
        _quiet_libraries()
        # 1. Check the spec.
        runtime = read_spec(spec_path)
        spec = runtime.spec
        strategy = strategies.get_strategy(spec.parallelism.strategy)
        gpu = worldmod.has_gpu()
        if spec.parallelism.gpus_per_node > 0 and not gpu:
            log.warning("spec asks for %d GPUs per node but none is visible: running on CPU",
                        spec.parallelism.gpus_per_node)
        strategy.validate(spec, gpu)
        prompts = all_prompts(runtime)
        tasks = image_tasks(prompts, spec.generation)
        # Resolved (a tiny model built) before the world exists: see resolve_model.
        source, revision = pipeline.resolve_model(runtime)
        # The layout against the model's config files (sequence lengths, heads): seconds, not
        # the minutes of loading the weights first.
        strategy.preflight(spec, source, revision, gpu)

        # 2. Set up the world.
        world = worldmod.setup_world(spec.parallelism, strategy.group_size(spec))
        layout = world.layout
        writer = writermod.OutputWriter(runtime, layout.rank)
        writer.check_existing_job()
        # Heartbeats start now: loading a large model takes minutes, and a silent rank would
        # look stalled to the operator.
        target = progress.kube_target_from_env()
        reporter = None
        if target is not None:
            reporter = progress.ConfigMapReporter(
                target, layout.rank, int(os.environ.get("MURALIST_ATTEMPT", "0"))).start()

        # 3. Load the pipeline (staged to node-local disk first when asked), check that the
        # model supports the layout, and parallelise it.
        start = time.perf_counter()
        loading = spec.model.loading
        if loading is not None and loading.stage:
            staged, _ = stage.stage_model(source, revision, layout.local_rank)
            source, revision = str(staged), None
        pipe = pipeline.load_pipeline(runtime, source, revision,
                                      **strategy.load_kwargs(spec, gpu))
        strategy.check_model(pipe, spec)
        pipeline.check_call(pipe, tasks)
        pipe = strategy.place(pipe, spec, world)
        if spec.generation.vae_tiling and not pipeline.enable_vae_tiling(pipe):
            log.warning("generation.vaeTiling: this pipeline's VAE cannot tile; decoding whole")
        verify = spec.parallelism.verify and layout.group_size > 1
        if spec.parallelism.verify and not verify:
            log.info("parallelism.verify: nothing to compare for %s (no parallel group)",
                     spec.parallelism.strategy)
        # The canary's single-rank reference: before enable_parallelism, which cannot be undone.
        reference = canary.reference(pipe, runtime, tasks[0], world) if verify else None
        pipe = strategy.parallelize(pipe, spec, world)
        timings["loadSeconds"] = time.perf_counter() - start
        log.info("pipeline loaded in %.1fs", timings["loadSeconds"])
        if verify:
            start = time.perf_counter()
            canary.check(pipe, runtime, tasks[0], world, reference,
                         strategy_layout(spec))
            timings["verifySeconds"] = time.perf_counter() - start
        if spec.generation.compile:
            compile_and_warm_up(pipe, runtime, tasks[0], gpu, layout.group_size > 1, timings)

        # 4. Plan shards: this group's images, minus those already on disk. Every rank looks
        # after the same barrier, before anyone writes, so a group's ranks agree on the list.
        share = strategy.plan(tasks, layout)
        if layout.rank == 0:
            writer.prepare()
            writer.write_job(layout.describe())
        world.barrier()
        done = [t for t in share if writer.is_complete(t)]
        pending = [t for t in share if not writer.is_complete(t)]
        prog = progress.Progress(layout.rank, len(share), layout.writes_images,
                                 local=os.environ.get("MURALIST_LOCAL") == "1", reporter=reporter)
        counts = prog.counts
        for task in done:
            if layout.writes_images:
                writer.log(task, "skipped")
            prog.image_done(task.key, "skipped", 0.0)

        # 5. Generate and 6. write (only a group's first rank writes; all render). Writer
        # threads encode and write while the next image renders; an image counts once on disk.
        knobs = TestKnobs.from_env()
        start = time.perf_counter()
        if layout.writes_images:
            bg = writermod.BackgroundWriter(writer.write_image)
        for batch in batches(pending, spec.generation.batch_size):
            t0 = time.perf_counter()
            images = pipeline.render(pipe, runtime, batch, on_step=prog.step_done)
            seconds = (time.perf_counter() - t0) / len(batch)
            if bg is None:
                for task in batch:
                    prog.image_done(task.key, "completed", seconds)  # counts nothing: no writer
                continue
            for task, image in zip(batch, images, strict=True):
                bg.submit(task, image, seconds)
            if knobs.active:
                bg.wait_idle()
            record_writes(bg, prog, knobs, layout.rank)
        if bg is not None:
            bg.close()  # drains the queue; raises a write error
            record_writes(bg, prog, knobs, layout.rank)
        timings["generateSeconds"] = time.perf_counter() - start
        log.info("generated %d images in %.1fs (load %.1fs)", len(pending),
                 timings["generateSeconds"], timings["loadSeconds"])

        # 7. Summarise: rank 0 merges the manifests once every rank has written.
        world.barrier()
        if layout.rank == 0:
            entries = writer.merge_manifest(tasks)
            gallery = writer.write_gallery(entries)
            writer.write_job(layout.describe(), timings)
            log.info("%d of %d images in %s", len(entries), len(tasks), gallery)
        prog.close()
        if layout.local_rank == 0:
            progress.write_termination(
                progress.summary(counts, 0, False, "Completed", "", timings))
        return 0
    except PermanentFailure as e:
        print(f"muralist: {e}", file=sys.stderr, flush=True)
        finish_writes(bg, prog)
        progress.write_termination(progress.summary(
            counts, PERMANENT_FAILURE_EXIT_CODE, True, "PermanentFailure", str(e), timings))
        return PERMANENT_FAILURE_EXIT_CODE
    except Exception as e:
        traceback.print_exc()
        finish_writes(bg, prog)
        message = f"{type(e).__name__}: {e}".splitlines()[0]
        progress.write_termination(progress.summary(counts, 1, False, "Error", message, timings))
        return 1
    finally:
        if prog is not None:
            prog.close()  # the final counts reach the ConfigMap on failures too
        elif reporter is not None:
            reporter.close()
        if world is not None:
            world.close()


def strategy_layout(spec: Any) -> str:
    """The group layout in words, for the canary's message."""
    par = spec.parallelism
    if par.context_parallel is not None:
        cp = par.context_parallel
        return (f"ContextParallel ring {cp.ring_degree} x ulysses {cp.ulysses_degree}, "
                f"{cp.attention_backend}")
    if par.tensor_parallel is not None:
        return f"TensorParallel degree {par.tensor_parallel.degree}"
    return str(par.strategy)


def compile_and_warm_up(pipe: Any, runtime: RuntimeSpec, task: ImageTask, gpu: bool,
                        parallel: bool, timings: dict[str, float]) -> None:
    """generation.compile: regional compile, then one call at the job's resolution.

    The warm-up pays the compilation before generateSeconds starts. On CPU the option is
    accepted and ignored (inductor's CPU codegen needs a compiler toolchain the runtime image
    need not have, and CPU runs are tests and demos).
    """
    from . import pipeline

    if not gpu:
        log.warning("generation.compile: ignored on CPU (GPU only)")
        return
    start = time.perf_counter()
    what = pipeline.compile_transformer(pipe, parallel)
    pipeline.render(pipe, runtime, [task], steps=min(2, runtime.spec.generation.steps))
    timings["compileSeconds"] = time.perf_counter() - start
    log.info("compiled %s and warmed up in %.1fs", what, timings["compileSeconds"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="muralist_runtime",
                                     description="Render this rank's share of a DiffusionJob.")
    parser.add_argument("--spec", required=True, help="RuntimeSpec JSON file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stderr)
    return run(args.spec)
