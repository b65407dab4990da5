"""The runtime's main path: `python -m muralist_runtime --spec FILE`, one process per rank.

Pods run it under `torchrun -m muralist_runtime --spec ...` (or `accelerate launch -m ...`).
It reads as the steps it takes: check the spec, set up the world, load the pipeline, plan
shards, generate and write, summarise.

Exit codes: 0 done; spec.PERMANENT_FAILURE_EXIT_CODE (78) when retrying cannot help; anything
else (1) is retryable. torchrun replaces a worker's code with its own, so the verdict also goes
to the termination message (progress.write_termination), where the operator and
`muralist run` read it.

Test-only knob: MURALIST_TEST_EXIT_AFTER=N makes a rank (MURALIST_TEST_EXIT_RANK, default 0)
`os._exit(17)` right after writing its N-th image, standing in for a killed pod.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

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
    from . import pipeline, progress, strategies
    from . import world as worldmod
    from . import writer as writermod

    counts = progress.Counts()
    world = None
    prog = None
    reporter = None
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

        # 3. Load the pipeline (and check that the model supports the layout).
        pipe = pipeline.load_pipeline(runtime, source, revision,
                                      **strategy.load_kwargs(spec, gpu))
        strategy.check_model(pipe, spec)
        pipeline.check_call(pipe, tasks)
        pipe = strategy.prepare(pipe, spec, world)

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

        # 5. Generate and 6. write (only a group's first rank writes; all render).
        exit_after = int(os.environ.get("MURALIST_TEST_EXIT_AFTER", "0"))
        exit_rank = int(os.environ.get("MURALIST_TEST_EXIT_RANK", "0"))
        written = 0
        for batch in batches(pending, spec.generation.batch_size):
            start = time.perf_counter()
            images = pipeline.render(pipe, runtime, batch)
            seconds = (time.perf_counter() - start) / len(batch)
            for task, image in zip(batch, images, strict=True):
                if layout.writes_images:
                    writer.write_image(task, image, seconds)
                    written += 1
                prog.image_done(task.key, "completed", seconds)
                if exit_after and written == exit_after and layout.rank == exit_rank:
                    os._exit(17)

        # 7. Summarise: rank 0 merges the manifests once every rank has written.
        world.barrier()
        if layout.rank == 0:
            entries = writer.merge_manifest(tasks)
            gallery = writer.write_gallery(entries)
            log.info("%d of %d images in %s", len(entries), len(tasks), gallery)
        prog.close()
        if layout.local_rank == 0:
            progress.write_termination(progress.summary(counts, 0, False, "Completed", ""))
        return 0
    except PermanentFailure as e:
        print(f"muralist: {e}", file=sys.stderr, flush=True)
        progress.write_termination(progress.summary(
            counts, PERMANENT_FAILURE_EXIT_CODE, True, "PermanentFailure", str(e)))
        return PERMANENT_FAILURE_EXIT_CODE
    except Exception as e:
        traceback.print_exc()
        message = f"{type(e).__name__}: {e}".splitlines()[0]
        progress.write_termination(progress.summary(counts, 1, False, "Error", message))
        return 1
    finally:
        if prog is not None:
            prog.close()  # the final counts reach the ConfigMap on failures too
        elif reporter is not None:
            reporter.close()
        if world is not None:
            world.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="muralist_runtime",
                                     description="Render this rank's share of a DiffusionJob.")
    parser.add_argument("--spec", required=True, help="RuntimeSpec JSON file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stderr)
    return run(args.spec)
