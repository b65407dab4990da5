"""The runtime's main path: `python -m muralist_runtime --spec FILE`, one process per rank.

In a pod, the launch entry point (`python -m muralist_runtime.launch --spec FILE`, the command
the operator sets) starts the launcher agent, and the launcher (torchrun, or accelerate launch)
starts this module once per rank.

`run` reads as the steps it takes, one function each: check the spec and plan the work, set up
the world, load the pipeline, generate and write, summarise.

Exit codes (the pod contract): 0 done; PERMANENT_FAILURE_EXIT_CODE (78) when retrying cannot
help; anything else (1) is retryable. torchrun replaces a worker's code with its own, so the
verdict also goes to the termination message, where the operator and `muralist run` read it.
Test-only failure injection: testing/faults.py.

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
from pathlib import Path
from typing import Any

from muralist_api import contract
from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE, PermanentFailure, Termination
from muralist_api.contract.env import PodEnv
from muralist_api.contract.output_format import Chunks
from muralist_api.rules.problems import problems_from
from muralist_api.runtime_spec import RuntimeSpec
from pydantic import ValidationError

from .model import canary, options, pipeline, staging, strategies
from .outputs import layouts, merge, temps, writer
from .outputs.temps import TempRemoved
from .render import claim_loop
from .render.state import Job, RunState
from .report import rank_files
from .report.progress import RankProgress
from .report.push import PodReporter, target_from_env
from .report.rank_files import RankFile, progress_dir, read_counts
from .report.termination import termination_log_path, write_termination
from .work import chunks, claims, item_failures, rows
from .work.chunks import NothingLeft
from .world import distributed

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


# How long a retried pod tries the store before it concludes that a merged job is over.
STORE_PROBE_SECONDS = 15.0


def peak_memory_mib() -> float:
    """This process's peak resident memory (VmHWM), for job.json and the termination message."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _quiet_libraries() -> None:
    # Pods log one line per image; library warnings (experimental APIs, optional torchvision)
    # and per-component loading bars would drown them. Set before the libraries are imported.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    # huggingface_hub's HTTP client logs every request at INFO: dozens of lines per model.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)


# 1. Check the spec.
def check_spec(spec_path: str) -> Job:
    runtime = read_spec(spec_path)
    spec = runtime.spec
    gpu = distributed.uses_gpu(spec.parallelism)
    if spec.parallelism.gpus_per_node > 0 and not gpu:
        log.warning("spec asks for %d GPUs per node but none is visible: running on CPU",
                    spec.parallelism.gpus_per_node)
    strategy = strategies.get_strategy(spec.parallelism.strategy)
    source_rows = rows.open_rows(runtime)
    plan_of_work = chunks.make_plan(spec, source_rows.count(), source_rows.start)
    if plan_of_work.rows == 0:
        raise PermanentFailure("spec.dataset", "no rows to render (check start and end)")
    first = rows.items_of(rows.peek(runtime), spec.generation)[0]
    # Resolved (a tiny model built) before the world exists: see resolve_model.
    source, revision = pipeline.resolve_model(runtime)
    # The layout against the catalog and the model's config files: seconds, not the minutes
    # of loading the weights first.
    plan = strategy.plan(spec, source, revision, gpu)
    return Job(runtime, strategy, plan, source_rows, plan_of_work, first, source, revision, gpu)


# 2. Set up the world: the torchrun world, the claim store, progress.
def set_up_world(job: Job, state: RunState) -> None:
    state.world = distributed.setup_world(job.runtime.spec.parallelism, job.plan.group_size)
    layout = state.world.layout
    state.jobfile = writer.JobFile(job.runtime)
    # A folder resumed keeps its own chunks (its part files name them), whatever this world is.
    job.work = layouts.resumed_plan(job.runtime, job.work, state.jobfile.check_existing())
    state.jobfile.chunks = Chunks(job.work.start, job.work.chunk_rows)
    host, port = chunks.claims_address()
    if layout.hosts_store:
        state.server = claims.ClaimServer(port)
        state.jobfile.write(layout.describe())
    jobfile = state.jobfile
    gone = f"the job was merged in {jobfile.root} and its first pod is gone"
    if not layout.hosts_store and jobfile.merged():
        probe = claims.ClaimClient(host, port, chunks.NAMESPACE)
        if not probe.reachable(STORE_PROBE_SECONDS):
            # This pod was retried after the first pod merged the job and left: nothing is left.
            raise NothingLeft(gone)

    def merged_meanwhile() -> None:
        # A pod that starts (or loads) slower than the whole job takes: the first pod merged
        # and left while this one waited for its store.
        if not layout.hosts_store and jobfile.merged():
            raise NothingLeft(gone)

    if layout.writes_images or layout.hosts_store:
        state.claims = claims.ClaimClient(host, port, chunks.NAMESPACE, on_outage=merged_meanwhile)
    if layout.writes_images:
        state.layout = layouts.layout_for(job.runtime, layout.rank)
        state.layout.prepare()
    # Heartbeats start now: loading a large model takes minutes, and a silent pod would look
    # stalled to the operator.
    directory = progress_dir()
    target = target_from_env()
    if target is not None and layout.local_rank == 0:
        state.reporter = PodReporter(target, directory).start()
    local = PodEnv.from_environ().local
    state.progress = RankProgress(layout.rank, job.work.total_items, layout.writes_images, local=local,
                                  rank_file=RankFile(directory, layout.rank))


# 3. Load the pipeline, check that the model supports the layout, apply the job's features
# (adapters, scheduler, step cache), and parallelise it.
def load(job: Job, state: RunState) -> Any:
    spec, world, timings = job.runtime.spec, state.world, state.timings
    start = time.perf_counter()
    source, revision = job.source, job.revision
    loading = spec.model.loading
    if loading is not None and loading.stage:
        staged, _ = staging.stage_model(source, revision, world.layout.local_rank)
        source, revision = str(staged), None
    pipe = pipeline.load_pipeline(job.runtime, source, revision, **job.plan.load_kwargs)
    job.strategy.check_model(pipe, job.plan)
    pipeline.check_call(pipe, spec)
    pipe = job.strategy.place(pipe, job.plan, world)
    # Before the canary's reference and enable_parallelism (options.py says why).
    options.apply_features(pipe, job.runtime)
    if spec.generation.vae_tiling and not pipeline.enable_vae_tiling(pipe):
        log.warning("generation.vaeTiling: this pipeline's VAE cannot tile; decoding whole")
    verify = spec.parallelism.verify and world.layout.group_size > 1
    if spec.parallelism.verify and not verify:
        log.info("parallelism.verify: nothing to compare for %s (no parallel group)", spec.parallelism.strategy)
    # The canary's single-rank reference: before enable_parallelism, which cannot be undone.
    reference = canary.reference(pipe, job.runtime, job.first, world) if verify else None
    pipe = job.strategy.parallelize(pipe, job.plan, world)
    timings["loadSeconds"] = time.perf_counter() - start
    log.info("pipeline loaded in %.1fs", timings["loadSeconds"])
    if verify:
        start = time.perf_counter()
        canary.check(pipe, job.runtime, job.first, world, reference, job.plan.describe())
        timings["verifySeconds"] = time.perf_counter() - start
    if spec.generation.compile:
        compile_and_warm_up(pipe, job, state)
    return pipe


def compile_and_warm_up(pipe: Any, job: Job, state: RunState) -> None:
    """generation.compile: regional compile, then one call at the job's resolution and batch.

    The warm-up pays the compilation before generateSeconds starts (at the batch size the job
    renders: a batch of another size would compile again at the first real call). On CPU the option is
    accepted and ignored (inductor's CPU codegen needs a compiler toolchain the runtime image
    need not have, and CPU runs are tests and demos).
    """
    if not job.gpu:
        log.warning("generation.compile: ignored on CPU (GPU only)")
        return
    start = time.perf_counter()
    what = pipeline.compile_transformer(pipe, state.world.layout.group_size > 1)
    batch = [job.first] * job.runtime.spec.generation.batch_size
    pipeline.render(pipe, job.runtime, batch, steps=min(2, job.runtime.spec.generation.steps))
    state.timings["compileSeconds"] = time.perf_counter() - start
    log.info("compiled %s and warmed up in %.1fs", what, state.timings["compileSeconds"])


# 4. Generate: claim chunks until none is left, render, write (render/claim_loop.py).
def generate_all(job: Job, pipe: Any, state: RunState) -> None:
    try:
        claim_loop.generate(job, pipe, state)
    except TempRemoved as e:
        if not state.jobfile.merged():
            raise  # another pod's clean-up judged this writer dead: retried
        # A duplicate writer (a sweeping group) that the merge overtook: its work is not needed.
        raise NothingLeft(f"the job was merged while this group wrote a duplicate: {e}") from None


# 5. Summarise: the first pod's first rank waits for every chunk, then merges; each pod's
# first rank waits for its other ranks (a hung one fails the pod instead of holding it).
def summarise(job: Job, state: RunState) -> None:
    layout = state.world.layout
    state.progress.finished()
    if layout.hosts_store:
        merge_outputs(job, state)
    if layout.local_rank == 0:
        rank_files.wait_for_pod(progress_dir(), job.runtime.spec.parallelism.collective_timeout_seconds)


def merge_outputs(job: Job, state: RunState) -> None:
    layout = state.world.layout
    start = time.perf_counter()
    # A hung rank of this pod holds its chunk forever: fail the pod (retried) instead of waiting.
    # Another pod's is the operator's to retry (its stall timeout); should no chunk finish for
    # the bound all the same, this pod fails and its retry claims the missing chunks itself.
    timeout = job.runtime.spec.parallelism.collective_timeout_seconds
    chunks.Tally(state.claims).wait_all(
        job.work.chunks, lambda _done: rank_files.pending_ranks(progress_dir(), timeout),
        bound=chunks.merge_wait_bound(job.work, timeout, state.progress.slowest_item_seconds),
        holder=lambda group: f"pod {group * layout.group_size // layout.local_world_size}")
    state.timings["waitSeconds"] = time.perf_counter() - start
    spec = job.runtime.spec
    caption = {"model": spec.model.name, "strategy": spec.parallelism.strategy,
               "scheduler": spec.generation.scheduler.name if spec.generation.scheduler else None,
               "adapters": [{"name": a.name, "scale": a.scale} for a in spec.model.adapters]}
    counts = merge.merge(state.jobfile.root, job.work.chunks, job.runtime.name, spec.output.gallery_page_size,
                         caption)
    state.jobfile.write(layout.describe(), state.timings, {"items": counts})
    # Merged: no temp of the tree is needed any more (a killed writer's, a slow duplicate's).
    if removed := temps.remove_all_in(layouts.tree(state.jobfile.root)):
        log.info("removed %d temp files left by killed or duplicate writers", len(removed))
    log.info("%s of %d items in %s", counts, job.work.total_items, state.jobfile.root)
    failed = counts.get("failed", 0)
    verdict = item_failures.merge_verdict(sum(counts.values()) - failed, failed)
    if verdict is not None:  # merged all the same: the manifest and the gallery say why each failed
        raise item_failures.failure(verdict, merge.first_failed(state.jobfile.root, job.work.chunks))


def verdict_printed_by_launcher() -> bool:
    """Under the launch entry point a permanent verdict is printed once for the pod, from the
    termination message: a rank that printed it too would repeat it once per rank."""
    return PodEnv.from_environ().launched and termination_log_path() is not None


def run(spec_path: str) -> int:
    state = RunState()
    try:
        _quiet_libraries()
        job = check_spec(spec_path)
        set_up_world(job, state)
        pipe = load(job, state)
        generate_all(job, pipe, state)
        summarise(job, state)
        state.timings["peakMemoryMiB"] = peak_memory_mib()
        if state.world.layout.local_rank == 0:
            # The pod's counts (all its ranks are done: summarise waited for them), the job's total.
            write_termination(Termination(read_counts([progress_dir()]), timings=state.timings))
        return contract.EXIT_OK
    except NothingLeft as e:
        log.info("nothing to do: %s", e)
        state.finish_writes()
        write_termination(Termination(state.counts, message=str(e)))
        return contract.EXIT_OK
    except PermanentFailure as e:
        state.finish_writes()
        write_termination(Termination(state.counts, PERMANENT_FAILURE_EXIT_CODE, True, "PermanentFailure", str(e),
                                      state.timings))
        if not verdict_printed_by_launcher():
            print(f"muralist: {e}", file=sys.stderr, flush=True)
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
