"""The end of a job: one manifest, one Parquet index and a paginated gallery, as a stream.

The first pod's first rank runs this once every chunk is finished (`merge_job`, which waits with
work/chunks.py's `Tally.wait_all`): no world-wide barrier, since pods do not share a process group.
It reads the chunk part files in chunk order (each sorted by item), so the outputs come out in item
order without ever holding more than one chunk: a million-item job merges in one pass, with no quadratic step.

The merge proves the job complete: the manifest holds every planned item exactly once, rendered, kept or
failed. A part file that is missing (a pod wrote where the first pod cannot see: an emptyDir of its own),
that cannot be read after a few tries, or that does not list exactly its chunk's items fails the merge
(`MergeIncomplete`, retryable, naming the chunks and the pods that held them), before the manifest is
published: never a success with items missing. The counts it returns are the manifest's: the job file, the
first pod's termination message and so the job's status take them from there.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from muralist_api.contract import CheckpointSteps, Counts, output_folder
from muralist_api.items import item_key, printable
from muralist_api.runtime_spec import RuntimeSpec

from ..step_cache import verdict as cache_verdict
from ..work import compile_records, item_failures
from ..work.chunks import Tally, WorkPlan, merge_wait_bound, owner
from ..work.claims import ClaimClient
from ..work.item_failures import NAMED, describe_item
from ..world.distributed import Layout
from . import checkpoints, layouts, parts, shards, storage, temps
from .gallery import write_gallery
from .parts import read_part
from .writer import JobFile

log = logging.getLogger("muralist")


# Tries of a part file that exists but cannot be read now (a store's transient error), and the pause between.
READ_TRIES = 4
READ_PAUSE_SECONDS = 0.5


class MergeIncomplete(RuntimeError):
    """Planned items the part files do not hold: the merge fails (retryable) instead of succeeding."""


Holder = Callable[[int], str]  # a chunk -> who held it ("pod 1"), for messages


def entries(root: Path, chunks: int, plan: WorkPlan | None = None,
            holder: Holder = lambda _chunk: "") -> Iterator[dict[str, Any]]:
    """The entries of every chunk in order. With the `plan`, each chunk's part must list exactly its planned
    items: else MergeIncomplete (without it, a missing part reads as empty: tests and readers of a folder)."""
    if plan is None:
        for chunk in range(chunks):
            yield from read_part(root, chunk) or []
        return
    for chunk in range(chunks):
        part = _load(root, chunk, holder)
        listed = [e.get("key") for e in part]
        planned = planned_keys(plan, chunk)
        if sorted(listed, key=str) != planned:
            lost = [k for k in planned if k not in listed]
            extra = sorted({k for k in listed if k not in planned or listed.count(k) > 1}, key=str)
            raise MergeIncomplete(
                f"{parts.part_path(root, chunk).relative_to(root)} does not list its chunk's items exactly once"
                f"{_held(holder, chunk)}: missing {_few(lost)}, unexpected or repeated {_few(extra)}; failing this "
                "pod, so that its retry renders the chunk again")
        yield from part


def check_present(root: Path, chunks: int, holder: Holder) -> None:
    """Every chunk's part file is listed in the folder: else MergeIncomplete naming the missing ones."""
    present = set(_part_numbers(root))
    missing = [chunk for chunk in range(chunks) if chunk not in present]
    if missing:
        raise MergeIncomplete(_missing_message(root, missing, holder))


def planned_keys(plan: WorkPlan, chunk: int) -> list[str]:
    """The keys of a chunk's items, in order."""
    begin, end = plan.bounds(chunk)
    return [item_key(row, image) for row in range(begin, end) for image in range(plan.images_per_prompt)]


def _part_numbers(root: Path) -> list[int]:
    names = storage.at(root).names(root / output_folder.PARTS_DIR)
    return [n for name in names if (n := output_folder.part_number(name)) is not None]


def _load(root: Path, chunk: int, holder: Holder) -> list[dict[str, Any]]:
    for attempt in range(READ_TRIES):
        try:
            return parts.load_part(root, chunk)
        except FileNotFoundError:
            raise MergeIncomplete(_missing_message(root, [chunk], holder)) from None
        except OSError as e:
            if attempt == READ_TRIES - 1:
                raise MergeIncomplete(f"{parts.part_path(root, chunk).relative_to(root)}{_held(holder, chunk)} "
                                      f"cannot be read ({e.strerror or e}) after {READ_TRIES} tries; failing this "
                                      "pod, so that its retry merges again") from e
            log.warning("reading part file of chunk %d failed (%s); trying again", chunk, e)
            time.sleep(READ_PAUSE_SECONDS * 2 ** attempt)
    raise AssertionError("unreachable")


def _missing_message(root: Path, missing: list[int], holder: Holder) -> str:
    held = sorted({h for c in missing if (h := holder(c))})
    return (f"no part file for {len(missing)} chunk(s) in {storage.at(root).where(root)}: {_few(missing)}"
            f"{f' (rendered by {_few(held)})' if held else ''}; the first pod cannot see them: is spec.output a "
            "volume every pod mounts (a ReadWriteMany volume, or a uri)? Failing this pod, so that its retry "
            "renders them again")


def _held(holder: Holder, chunk: int) -> str:
    who = holder(chunk)
    return f" (chunk {chunk}, rendered by {who})" if who else f" (chunk {chunk})"


def _few(values: list[Any], show: int = 5) -> str:
    shown = ", ".join(str(v) for v in values[:show])
    return (shown + (f", and {len(values) - show} more" if len(values) > show else "")) or "none"


def first_failed(root: Path, chunks: int) -> list[str]:
    """The first failed items in item order, described (item_failures.NAMED of them)."""
    failed = (e for e in entries(root, chunks) if e.get("status") == "failed")
    return [describe_item(e.get("key", "?"), e.get("id"), e.get("error")) for e in islice(failed, NAMED)]


def index_row(entry: dict[str, Any]) -> dict[str, Any]:
    shard = entry.get("shard")
    return {
        "index": entry.get("index"),
        "id": _utf8(entry.get("id")),
        "key": entry.get("key"),
        "prompt": _utf8(entry.get("prompt")),
        "seed": entry.get("seed"),
        "shard": output_folder.shard_number(shard) if shard else None,
        "status": entry.get("status"),
        "seconds": entry.get("seconds"),
        "error": _utf8(entry.get("error")),
    }


def _utf8(text: Any) -> Any:
    """A Parquet string is UTF-8: a row's text with a lone surrogate is escaped (the manifest keeps it)."""
    return printable(text) if isinstance(text, str) else text


def merge(root: Path, chunks: int, title: str, page_size: int, caption: dict[str, Any],
          sampled: list[dict[str, Any]] | None = None, plan: WorkPlan | None = None,
          holder: Holder = lambda _chunk: "", checkpointed: dict[str, int] | None = None) -> dict[str, int]:
    """The manifest, the index and the gallery; returns the counts by status, and `rerendered` (the
    rendered items that replaced an output of another request). `sampled` collects the rows the cache
    gate measured (cache_verdict.ROW_FIELD); `checkpointed` sums runPolicy.checkpoint's fields of the records
    (resumed items, stepsSaved, stepsLost). With the `plan`, every planned item must be there
    (`entries`): else MergeIncomplete, and nothing is published."""
    counts: dict[str, int] = {}
    manifest = root / output_folder.MANIFEST_FILE
    if plan is not None:
        check_present(root, chunks, holder)  # before anything is written
    tmp = temps.opened(temps.temp_path(manifest))
    index = shards.IndexWriter(root / output_folder.INDEX_FILE)

    def stream() -> Iterator[dict[str, Any]]:
        with open(tmp, "w") as out:
            for entry in entries(root, chunks, plan, holder):
                counts[entry.get("status", "")] = counts.get(entry.get("status", ""), 0) + 1
                if entry.get("replaced"):
                    counts["rerendered"] = counts.get("rerendered", 0) + 1
                if sampled is not None and cache_verdict.ROW_FIELD in entry:
                    sampled.append(entry)
                if checkpointed is not None:
                    _count_steps(checkpointed, entry)
                out.write(json.dumps(entry, sort_keys=True) + "\n")
                index.write(index_row(entry))
                yield entry
            out.flush()

    try:
        write_gallery(root, title, stream(), page_size=page_size, caption=caption)
        # Derived from the part files: rewritten by a rerun. Index and gallery pages after it.
        storage.at(manifest).publish(tmp, manifest, sync_dir=False)
        index.close()
    except BaseException:
        index.abort()
        tmp.unlink(missing_ok=True)
        temps.closed(tmp)
        raise
    return counts


def _count_steps(checkpointed: dict[str, int], entry: dict[str, Any]) -> None:
    for name, field in (("resumed", "resumedFromStep"), ("stepsSaved", "stepsSaved"), ("stepsLost", "stepsLost")):
        value = entry.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            checkpointed[name] = checkpointed.get(name, 0) + (1 if name == "resumed" else value)


def merge_job(runtime: RuntimeSpec, work: WorkPlan, jobfile: JobFile, claims: ClaimClient, layout: Layout,
              pending: Callable[[int], object], slowest_item_seconds: float, timings: dict[str, float],
              learned: dict[str, Any] | None = None,
              memory: Callable[[], dict[str, Any]] | None = None) -> tuple[Counts, CheckpointSteps | None]:
    """The first pod's first rank: wait for every chunk, merge, and fail the job when its failed
    items say so; returns the job's items as the manifest has them, and with runPolicy.checkpoint the steps
    its records say were saved and lost. `pending`: this pod's ranks not
    done yet (it raises on a stalled one); `memory`: the job file's memory estimate and measured peaks,
    read once every chunk is in."""
    start = time.perf_counter()
    # A hung rank of this pod holds its chunk forever: fail the pod (retried) instead of waiting.
    # Another pod's is the operator's to retry (its stall timeout); should no chunk finish for
    # the bound all the same, this pod fails and its retry claims the missing chunks itself.
    timeout = runtime.spec.parallelism.collective_timeout_seconds
    Tally(claims, lambda chunk: parts.chunk_counts(read_part(jobfile.root, chunk) or [])).wait_all(
        work.chunks, pending, bound=merge_wait_bound(work, timeout, slowest_item_seconds),
        holder=lambda group: f"pod {group * layout.group_size // layout.local_world_size}")
    timings["waitSeconds"] = time.perf_counter() - start
    spec = runtime.spec
    plan = runtime.parallel_plan
    caption = {"model": spec.model.name, "strategy": spec.parallelism.strategy,
               # strategy Auto: what it chose and why
               "plan": f"Auto ({plan.objective}): {plan.summary}" if plan is not None else None,
               "planReasons": plan.reasons if plan is not None else [],
               "scheduler": spec.generation.scheduler.name if spec.generation.scheduler else None,
               "adapters": [{"name": a.name, "scale": a.scale} for a in spec.model.adapters]}
    sampled: list[dict[str, Any]] = []
    def holder(chunk: int) -> str:
        group = owner(claims, chunk)
        return f"pod {group * layout.group_size // layout.local_world_size}" if group is not None else ""

    checkpointed: dict[str, int] = {}
    counts = merge(jobfile.root, work.chunks, runtime.name, spec.output.gallery_page_size, caption, sampled,
                   plan=work, holder=holder, checkpointed=checkpointed)
    summary: dict[str, Any] = {**(learned or {}), "items": counts}
    steps = None
    if spec.run_policy.checkpoint is not None or checkpointed:
        summary["checkpoints"] = {"resumed": 0, "stepsSaved": 0, "stepsLost": 0, **checkpointed}
        steps = CheckpointSteps(checkpointed.get("stepsSaved", 0), checkpointed.get("stepsLost", 0))
    if spec.generation.cache is not None and spec.generation.cache.verify is not None:
        off = cache_verdict.read_off(storage.at(jobfile.root), jobfile.root)
        summary["cacheVerify"] = cache_verdict.summarise(sampled, spec.generation.cache.verify.thresholds(), off)
    if memory is not None and (measured := memory()):
        summary["memory"] = measured
    if (compiled := compile_records.summary(claims)) is not None:
        summary["compile"] = compiled  # every rank's, told through the store (render/compiled.py)
    jobfile.write(layout.describe(), timings, summary)
    # Merged: no temp of the tree is needed any more (a killed writer's, a slow duplicate's).
    if removed := temps.remove_all_in(layouts.tree(jobfile.root)):
        log.info("removed %d temp files left by killed or duplicate writers", len(removed))
    if left := checkpoints.remove_all(jobfile.root):  # of items kept, or written by a pod killed before it removed them
        log.info("removed the checkpoints of %d items, all done", left)
    log.info("%s of %d items in %s", counts, work.total_items, jobfile.root)
    job = Counts(completed=counts.get("rendered", 0), skipped=counts.get("skipped", 0), failed=counts.get("failed", 0),
                 total=work.total_items, rerendered=counts.get("rerendered", 0))
    verdict = item_failures.merge_verdict(job.completed + job.skipped, job.failed)
    if verdict is not None:  # merged all the same: the manifest and the gallery say why each failed
        raise item_failures.failure(verdict, first_failed(jobfile.root, work.chunks))
    return job, steps
