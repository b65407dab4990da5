"""Step 4 of a rank's run: claim chunks until none is left; render and write their items.

Only a group's first rank claims, writes and counts; it shares each chunk's item list with
its group (the other ranks render the same items with it). An item fails on its own — a row
that could not be read, text that is not valid Unicode, an input image that is missing or
unreadable, an output with NaN values, any exception of its pipeline call (render/failures.py:
only a broken collective or a lost device fails the rank) — and is recorded with its reason;
when a chunk ends, item_failures decides whether the failures so far fail the job.
With runPolicy.checkpoint, each item's call runs inside model/checkpointing.py's `rendering`: resumed
from the item's checkpoint, its state saved every everySteps steps, and stopped at a step's end when
the pod is told to stop (its chunk is then handed back); the item's checkpoint goes once it is written.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.items import Item

from ..model import call
from ..model.checkpointing import Checkpointing
from ..outputs import requests, storage, writer
from ..outputs.layouts import FilesLayout, RenderedOutput, failed_entry, relisted
from ..outputs.parts import chunk_counts, read_part, write_part
from ..run_state import NotSetUp, RunPlan, RunState
from ..step_cache.gate import CacheGate
from ..testing import faults
from ..work import chunks, item_failures, rows
from ..world import drain
from . import batching, failures
from .compiled import compiled_size

log = logging.getLogger("muralist")
# What a group's first rank shares instead of a chunk when the pod was told to stop.
DRAINED = "drained"


@dataclass
class ChunkRun:
    """One chunk on its writing rank: entries so far, and submitted items to add in order."""

    chunk: int
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    stale: dict[str, list[str]] = field(default_factory=dict)  # on disk for another request: what changed
    order: list[str] = field(default_factory=list)  # keys submitted to the writer threads, in order
    done: dict[str, writer.Written] = field(default_factory=dict)  # written by the threads, not yet added


def chunk_stream(job: RunPlan, state: RunState) -> Iterator[tuple[int, bool]]:
    """(chunk, sweeping) for this group, decided by its first rank and shared with the group."""
    world = state.world
    layout = world.layout
    own = None
    if layout.writes_images:
        if faults.static_plan():
            own = chunks.static_chunks(job.work, layout.group_index, layout.dp_degree)
        else:
            # The first pod's groups stay to the end for chunks that drained pods hand back (a group's
            # other ranks wait for them in the share below, told to go on waiting now and then).
            linger = job.runtime.spec.parallelism.collective_timeout_seconds if layout.pod_index == 0 else 0.0
            # Done means counted in the store: a part file on disk may be of another request (run_chunk
            # checks it, and counts it when it is this one's).
            tally = _tally(job, state)
            own = chunks.dynamic_chunks(state.claims, job.work, tally.counted, layout.group_index, tally,
                                        linger=linger, stop=drain.requested,
                                        idle=state.progress.idle if linger else _busy)
    while True:
        try:
            step = next(own, None) if own is not None else None
        except chunks.NothingLeft:
            # The rest of the group waits in the share below: it must end the same way, not see
            # its first rank leave in the middle of a collective.
            world.share_in_group(chunks.NOTHING_LEFT)
            raise
        except drain.Drained:
            world.share_in_group(DRAINED)
            raise
        step = world.share_in_group(step)
        if step is None:
            return
        if step == (chunks.LINGERING, False):
            continue
        if step == chunks.NOTHING_LEFT:
            raise chunks.NothingLeft("the group's first rank found the job merged and its first pod gone")
        if step == DRAINED:
            raise drain.Drained("the group's first rank stopped claiming: the pod was told to stop")
        yield step


def _busy(_idle: bool) -> None:
    """A group that does not stay for handed-back chunks is never idle before it ends."""


def _part_counts(job: RunPlan, chunk: int) -> chunks.ChunkCounts:
    """A finished chunk's counts, from its part file."""
    return chunk_counts(read_part(Path(job.runtime.output_dir), chunk) or [])


def _tally(job: RunPlan, state: RunState) -> chunks.Tally:
    return chunks.Tally(state.claims, lambda c: _part_counts(job, c))


def generate(job: RunPlan, pipe: Any, state: RunState) -> None:
    layout = state.world.layout
    start = time.perf_counter()
    if layout.writes_images:
        state.background = writer.BackgroundWriter(
            state.layout.write, threads=writer.write_threads(job.gpu),
            stall_seconds=job.runtime.spec.parallelism.collective_timeout_seconds, where=state.jobfile.where)
    rendered = 0
    gate = CacheGate.for_job(job.runtime, job.work.start, job.work.total_items,
                             storage.at(Path(job.runtime.output_dir)), call.render_checked)
    state.checkpoints = Checkpointing.for_job(job.runtime, pipe, state.world, state.timings)
    try:
        for chunk, sweeping in chunk_stream(job, state):
            if gate is not None:
                gate.follow(pipe, state.world, state.writes)
            rendered += run_chunk(job, pipe, state, chunk, sweeping, gate)
    finally:
        sample = gate.sample() if gate is not None else None
        if sample is not None:
            state.progress.cache_measured(sample)
    if state.background is not None:
        state.background.close()  # raises a write error
    state.timings["generateSeconds"] = time.perf_counter() - start
    log.info("rendered %d items in %.1fs (load %.1fs)", rendered, state.timings["generateSeconds"],
             state.timings["loadSeconds"])


def _threads(state: RunState) -> writer.BackgroundWriter:
    """A writing rank's writer threads (generate starts them before its first chunk)."""
    if state.background is None:
        raise NotSetUp("RunState.background is read before generate starts it")
    return state.background


def _todo(job: RunPlan, state: RunState, chunk: int, sweeping: bool) -> tuple[list[Item] | None, ChunkRun | None]:
    """The chunk's items left to render, shared by the group (None: the chunk is done, for this request), and
    the writer's bookkeeping."""
    begin, end = job.work.bounds(chunk)
    run = None
    todo: list[Item] | None = None
    if state.world.layout.writes_images:
        items = rows.items_of(job.rows.rows(begin, end), job.runtime.spec.generation)
        part = read_part(Path(job.runtime.output_dir), chunk)
        if part is not None and _up_to_date(job, state, items, part):
            # Done whole by an earlier attempt: count it, render nothing, and list its items as this run
            # found them, kept (once: a part listed so already is left as it is).
            listed = {e["key"]: e for e in part}
            relist = [relisted(listed[i.key], i) for i in items]
            if relist != part:
                write_part(state.layout.root, chunk, relist)
            for entry in relist:
                state.progress.item_done(entry["key"], "skipped", 0.0)
            _tally(job, state).count(chunk)
        else:
            kept = state.layout.kept(chunk, items)
            run = ChunkRun(chunk, entries=kept.entries, stale=kept.stale)
            for key in run.entries:
                state.progress.item_done(key, "skipped", 0.0)
            todo = [i for i in items if i.key not in run.entries]
            if sweeping:
                todo.reverse()  # another group may still be on it: meet it in the middle
            state.layout.begin_chunk(chunk, run.entries)
    return state.world.share_in_group(todo), run


def _up_to_date(job: RunPlan, state: RunState, items: list[Item], part: list[dict[str, Any]]) -> bool:
    """Whether a finished chunk's part file lists every item of the chunk, none failed, each made for the
    request the item is now (outputs/requests.py)."""
    entries = {e.get("key"): e for e in part}
    for item in items:
        entry = entries.get(item.key)
        if entry is None or entry.get("status") == "failed":
            return False
        if requests.changed(job.runtime, item, entry, state.layout.trust) is not None:
            return False
    return True


def run_chunk(job: RunPlan, pipe: Any, state: RunState, chunk: int, sweeping: bool,
              gate: CacheGate | None = None) -> int:
    todo, run = _todo(job, state, chunk, sweeping)
    if todo is None:
        return 0
    test = faults.ImageCues()
    rendered = 0
    for batch in batching.shape_batches(todo, job.runtime.spec.generation):
        if state.world.share_in_group(drain.requested() if state.writes else None):
            _hand_back(job, state, chunk, run, test)
        if sweeping:  # a duplicate may have finished some meanwhile: those are kept
            batch = state.world.share_in_group(_not_kept_meanwhile(state, run, batch) if run is not None else None)
        try:
            results = render_items(job, pipe, state, batch, gate)
        except drain.StoppedMidItem as e:  # runPolicy.checkpoint: the item's state is saved
            _hand_back(job, state, chunk, run, test, f" ({e})")
        for item, image, reason, seconds in results:
            if run is None:
                continue
            if reason is not None:
                run.entries[item.key] = failed_entry(job.runtime, item, state.world.layout.rank, reason)
                state.progress.item_done(item.key, "failed", 0.0)
                continue
            assert image is not None
            image.metadata.update(requests.record(job.runtime, item))
            if state.checkpoints is not None:  # resumedFromStep, stepsSaved, stepsLost
                image.metadata.update(state.checkpoints.record(item.key))
            if item.key in run.stale:
                image.metadata["replaced"] = run.stale[item.key]
            _threads(state).submit(chunk, item, image, seconds)
            run.order.append(item.key)
            rendered += 1
            if test.active:
                _threads(state).wait_idle()
            _add_written(state, run, test)
    if run is not None:
        _end_chunk(job, state, run, test)
    return rendered


def _not_kept_meanwhile(state: RunState, run: ChunkRun, batch: list[Item]) -> list[Item]:
    """The batch's items that no duplicate writer finished for this request meanwhile (those join the chunk's
    entries as kept)."""
    kept = state.layout.kept(run.chunk, batch)
    for key, entry in kept.entries.items():
        run.entries[key] = entry
        state.progress.item_done(key, "skipped", 0.0)
    return [i for i in batch if i.key not in kept.entries]


Rendered = tuple[Item, RenderedOutput | None, str | None, float]


def render_items(job: RunPlan, pipe: Any, state: RunState, batch: list[Item], gate: CacheGate | None = None,
                 retry: bool = False) -> list[Rendered]:
    """(item, image, None, seconds) per rendered item, (item, None, reason, 0) per failed one; the
    cache gate's sampled items measured (their seconds include the render without the cache).

    A call that raises fails its items, not the rank (render/failures.py): a batch is tried again
    item by item, to find the one that fails; an item out of memory is tried once more, alone
    (`retry` marks that try). In a group of several ranks, the ranks agree on the outcome of every
    call, so that all of them fail, retry or go on alike."""
    if not batch:
        return []
    failed: list[Rendered] = [(i, None, i.error, 0.0) for i in batch if i.error]
    batch = [i for i in batch if not i.error]
    if not batch:
        return failed
    slow = faults.step_sleep(state.world.layout.rank)
    rows = [i.row for i in batch]

    def on_step() -> None:
        faults.raise_in_call(rows)
        state.progress.step_done()
        if slow:
            time.sleep(slow)

    t0 = time.perf_counter()
    with compiled_size(state, batch[0].shape(job.runtime.spec.generation)):
        results, error = _call(job, pipe, state, batch, gate, on_step)
    error = _group_outcome(state, error)
    if error is None:
        seconds = (time.perf_counter() - t0) / max(1, len(batch))
        return failed + [(item, image, why, seconds) for item, (image, why) in zip(batch, results, strict=True)]
    why, oom = error
    if len(batch) > 1:  # find the item that fails, render the others
        return failed + [r for one in batch for r in render_items(job, pipe, state, [one], gate, retry=True)]
    failures.release_memory()
    if oom and not retry:
        log.warning("item %s ran out of memory; trying it once more, alone: %s", batch[0].key, why)
        return failed + render_items(job, pipe, state, batch, gate, retry=True)
    log.warning("item %s failed: %s", batch[0].key, why)
    return [*failed, (batch[0], None, why, 0.0)]


Outcome = tuple[str, bool]  # a failed call: (its reason, out of memory)


def _call(job: RunPlan, pipe: Any, state: RunState, batch: list[Item], gate: CacheGate | None,
          on_step: Callable[[], None]) -> tuple[list[call.Checked], Outcome | None]:
    """One call's results, or why it failed; a failure of the world is raised."""
    checkpointed = (state.checkpoints.rendering(pipe, batch[0]) if state.checkpoints is not None
                    else contextlib.nullcontext())
    try:
        with checkpointed:
            results = call.render_checked(pipe, job.runtime, batch, on_step=on_step,
                                          pad_to=batching.call_size(job.runtime.spec.generation))
        for _ in range(faults.render_repeat(state.world.layout.rank) - 1):  # a test's slow rank: the same work again
            call.render_checked(pipe, job.runtime, batch)
        if gate is not None:
            results = gate.check(pipe, batch, results, on_step, state.writes)
    except (PermanentFailure, drain.Drained):
        raise  # a verdict on the job (the cache gate's), not an item's failure; a stop in the middle of an item
    except Exception as e:
        if failures.world_failure(e):
            raise  # a broken collective or a lost device: the pod fails and is retried
        return [], (failures.reason(e), failures.out_of_memory(e))
    return results, None


def _group_outcome(state: RunState, mine: Outcome | None) -> Outcome | None:
    """The call's outcome for the whole group: failed if it failed on any rank (every rank reached
    this point, so none is left in a collective of the call), out of memory if it was on any."""
    if state.world.layout.group_size == 1:
        return mine
    outcomes = [o for o in state.world.gather_in_group(mine) if o is not None]
    if not outcomes:
        return None
    return outcomes[0][0], any(oom for _, oom in outcomes)


def _add_written(state: RunState, run: ChunkRun, test: faults.ImageCues) -> None:
    """Add what the writer threads finished, in submission order (a shard's members are)."""
    for written in _threads(state).completed():
        run.done[written.item.key] = written
    while run.order and run.order[0] in run.done:
        written = run.done.pop(run.order.pop(0))
        run.entries[written.item.key] = state.layout.add(run.chunk, written.item, written.result)
        if state.checkpoints is not None and isinstance(state.layout, FilesLayout):
            state.checkpoints.written(written.item.key)  # on disk for good (a shard is at the chunk's end)
        state.progress.item_done(written.item.key, "completed", written.seconds,
                                 rerendered=written.item.key in run.stale)
        state.timings.setdefault("firstItemSeconds", time.perf_counter() - state.started)
        test.image_written(state.world.layout.rank)


def _hand_back(job: RunPlan, state: RunState, chunk: int, run: ChunkRun | None, test: faults.ImageCues,
               saved: str = "") -> None:
    """The pod was told to stop in the middle of a chunk: keep what is rendered (the writer
    threads finish it; whoever takes the chunk next skips those items), give the chunk back."""
    done = 0
    if run is not None:
        _threads(state).wait_idle()
        _add_written(state, run, test)
        state.layout.abandon_chunk(chunk)
        released = chunks.release(state.claims, chunk, state.world.layout.group_index)
        done = len([e for e in run.entries.values() if e.get("status") != "failed"])
        if not released:
            raise drain.Drained(f"stopped in chunk {chunk} with {done} of its items written{saved}; another group "
                                "took the chunk meanwhile and finishes it")
    raise drain.Drained(f"stopped in chunk {chunk} with {done} of its items written{saved}; the chunk is handed back "
                        "to the other pods")


def _end_chunk(job: RunPlan, state: RunState, run: ChunkRun, test: faults.ImageCues) -> None:
    _threads(state).wait_idle()
    _add_written(state, run, test)
    assert not run.order, f"chunk {run.chunk}: {len(run.order)} items written but not added"
    state.layout.end_chunk(run.chunk)
    entries = sorted(run.entries.values(), key=lambda e: e["index"])
    write_part(state.layout.root, run.chunk, entries)
    if state.checkpoints is not None:  # the chunk's items are written, or their failures recorded
        for entry in entries:
            state.checkpoints.written(entry["key"])
    completed, failed, failures = chunk_counts(entries)
    tally = _tally(job, state)
    verdict = tally.verdict(tally.finished(run.chunk, completed, failed, failures), job.runtime.spec.run_policy,
                            job.work.total_items)
    if verdict is not None:
        raise item_failures.failure(verdict, tally.first_failures() or failures)
