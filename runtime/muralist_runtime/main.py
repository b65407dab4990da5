"""The runtime's main path: `python -m muralist_runtime --spec FILE`, one process per rank.

In a pod, the launch entry point (`python -m muralist_runtime.launch --spec FILE`, the command
the operator sets) starts the launcher agent, and the launcher (torchrun, or accelerate launch)
starts this module once per rank.

`run` reads as the steps it takes, one function each: check the spec and plan the work, set up
the world, load the pipeline, generate and write, summarise. Each step hands its work to the
stage folders in turn, so a rank's run enters them in this order (tests/runtime/test_runtime_stages.py
measures it):

    Stages: plan, world, outputs, work, report, model, render, report, outputs, report

Each stage's folder is entered once, in that order, except the two that bracket the run: the job
folder (outputs) is opened before the work is claimed and merged after it, and progress (report)
starts before the model loads (minutes: a silent pod would look stalled), ends with the rank's
done, which the merge's wait reads, and carries the verdict last. The plan comes first and the
work and the model come after the world because the claim store and the pipeline need the world,
and the world's groups are the plan's group size.

Exit codes (the pod contract): 0 done; PERMANENT_FAILURE_EXIT_CODE (78) when retrying cannot
help; anything else (1) is retryable. torchrun replaces a worker's code with its own, so the
verdict also goes to the termination message, where the operator and `muralist run` read it.
A rank told to stop (world/drain.py) exits 0 with the Drained verdict; the launch entry point
turns that into the pod's DRAINED_EXIT_CODE.
Test-only failure injection: testing/faults.py.

Timings: loadSeconds, verifySeconds (model/loading.py), compileSeconds (model/compiling.py) and
generateSeconds go to the log, the job file and the termination message.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from muralist_api import contract
from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE, PermanentFailure, Termination
from muralist_api.contract.env import PodEnv
from muralist_api.rules.problems import problems_from
from muralist_api.runtime_spec import RuntimeSpec, read_runtime_spec
from pydantic import ValidationError

from .model import compiling, loading
from .outputs import job_folder, merge
from .outputs.temps import TempRemoved
from .plan import model as model_plan
from .plan import work as work_plan
from .render import claim_loop, compiled
from .report import progress, rank_files
from .report.rank_files import progress_dir, read_pod
from .report.termination import termination_log_path, write_termination
from .run_state import RunPlan, RunState
from .work import store
from .work.chunks import NothingLeft
from .world import distributed, drain, zygote

log = logging.getLogger("muralist")


def read_spec(path: str) -> RuntimeSpec:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PermanentFailure("--spec", f"cannot read {path}: {e.strerror}") from None
    try:
        # A field of a newer operator that this image lacks is refused by name there (exit 78).
        return read_runtime_spec(text)
    except ValidationError as e:
        # The same rules as admission; a spec that slipped past them (written by hand, an
        # older operator) is refused with admission's message, which names the field.
        problems = problems_from(e)
        field_name, _, message = problems[0].partition(": ")
        if not field_name.startswith("spec.") or not message:
            field_name, message = "--spec", f"{path} is not a valid RuntimeSpec: {problems[0]}"
        raise PermanentFailure(field_name, message) from None


def peak_memory_mib() -> float:
    """This process's peak resident memory (VmHWM), for the job file and the termination message."""
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
    for name, value in zygote.QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    # huggingface_hub's HTTP client logs every request at INFO: dozens of lines per model.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)


# 1. Check the spec and plan: the work (rows, chunks), then the model (plan/ says why before the
# world).
def check_spec(spec_path: str) -> RunPlan:
    runtime = read_spec(spec_path)
    source_rows, plan_of_work, first = work_plan.plan_work(runtime)
    strategy, plan, source, revision, gpu = model_plan.plan_model(runtime)
    return RunPlan(runtime, strategy, plan, source_rows, plan_of_work, first, source, revision, gpu)


# 2. Set up the world (torchrun's, for the plan's group size), then, in it, the job folder, the
# claim store, and progress.
def set_up_world(job: RunPlan, state: RunState) -> None:
    state.world = distributed.setup_world(job.runtime.spec.parallelism, job.plan.group_size)
    layout = state.world.layout
    state.jobfile, job.work, files = job_folder.open_job_folder(job.runtime, job.work, layout)
    state.server, client = store.connect(layout, state.jobfile.merged, str(state.jobfile.root))
    if client is not None:
        state.claims = client
    if files is not None:
        state.layout = files
    state.reporter, state.progress = progress.start(layout, job.work.total_items)


# 3. Load the pipeline (model/loading.py); what it learns of the model (a calibrated cache) goes to
# the job file at the merge. generation.compile: compiled at the first item's size (model/compiling.py),
# from the compile cache when it has the size, and this rank's record told to the merge.
def load(job: RunPlan, state: RunState) -> Any:
    pipe = loading.load(job.runtime, job.strategy, job.plan, job.source, job.revision, job.first, job.gpu,
                        state.world, state.timings, state.learned)
    if job.runtime.spec.generation.compile:
        state.compiled = compiling.compile_pipeline(pipe, job.runtime, job.first, job.source, job.revision, job.gpu,
                                                    state.world.layout.group_size > 1, state.timings)
        compiled.tell_records(state)
    return pipe


# 4. Generate: claim chunks until none is left, render, write (render/claim_loop.py).
def generate_all(job: RunPlan, pipe: Any, state: RunState) -> None:
    try:
        claim_loop.generate(job, pipe, state)
    except TempRemoved as e:
        if not state.jobfile.merged():
            raise  # another pod's clean-up judged this writer dead: retried
        # A duplicate writer (a sweeping group) that the merge overtook: its work is not needed.
        raise NothingLeft(f"the job was merged while this group wrote a duplicate: {e}") from None


# 5. Summarise: this rank says it is done; the first pod's first rank (the one that hosts the
# store) waits for every chunk, then merges; each pod's first rank waits for its other ranks (a
# hung one fails the pod instead of holding it).
def summarise(job: RunPlan, state: RunState) -> None:
    layout = state.world.layout
    state.progress.finished()
    timeout = job.runtime.spec.parallelism.collective_timeout_seconds
    if state.server is not None:
        state.merged, state.merged_steps = merge.merge_job(job.runtime, job.work, state.jobfile, state.claims, layout,
                                       rank_files.stall_watch(progress_dir(), timeout),
                                       state.progress.slowest_item_seconds, state.timings, state.learned,
                                       rank_files.memory_reader(progress_dir(), job.plan.memory_estimate))
    if layout.local_rank == 0:
        rank_files.wait_for_pod(progress_dir(), timeout)


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
            pod = read_pod([progress_dir()])
            write_termination(Termination(pod.counts, timings=state.timings, cache_sample=pod.cache_sample,
                                          job=state.merged, checkpoints=state.merged_steps))
        return contract.EXIT_OK
    except NothingLeft as e:
        log.info("nothing to do: %s", e)
        state.finish_writes()
        write_termination(Termination(state.counts, message=str(e)))
        return contract.EXIT_OK
    except drain.Drained as e:
        # Exit 0: the launcher would bury a failed worker under its own report; the launch entry
        # point gives the pod its exit code (DRAINED_EXIT_CODE) from the verdict.
        log.info("drained: %s", e)
        state.finish_writes()
        state.drained()
        write_termination(Termination(state.counts, contract.DRAINED_EXIT_CODE, False, "Drained", str(e),
                                      state.timings, state.cache_sample))
        return contract.EXIT_OK
    except PermanentFailure as e:
        state.finish_writes()
        write_termination(Termination(state.counts, PERMANENT_FAILURE_EXIT_CODE, True, "PermanentFailure", str(e),
                                      state.timings, state.cache_sample))
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
