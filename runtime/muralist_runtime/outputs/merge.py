"""The end of a job: one manifest, one Parquet index and a paginated gallery, as a stream.

The first pod's first rank runs this once every chunk is finished (`merge_job`, which waits with
work/chunks.py's `Tally.wait_all`): no world-wide barrier, since pods do not share a process group.
It reads the chunk part files in chunk order (each sorted by item), so the outputs come out in item
order without ever holding more than one chunk: a million-item job merges in one pass, with no quadratic step.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from muralist_api.items import printable
from muralist_api.runtime_spec import RuntimeSpec

from ..work import item_failures
from ..work.chunks import Tally, WorkPlan, merge_wait_bound
from ..work.claims import ClaimClient
from ..work.item_failures import NAMED, describe_item
from ..world.distributed import Layout
from . import cache_verdict, layouts, shards, storage, temps
from .gallery import write_gallery
from .layouts import read_part
from .writer import JobFile

log = logging.getLogger("muralist")


def entries(root: Path, chunks: int) -> Iterator[dict[str, Any]]:
    for chunk in range(chunks):
        yield from read_part(root, chunk) or []


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
        "shard": int(Path(shard).stem.split("-")[1]) if shard else None,
        "status": entry.get("status"),
        "seconds": entry.get("seconds"),
        "error": _utf8(entry.get("error")),
    }


def _utf8(text: Any) -> Any:
    """A Parquet string is UTF-8: a row's text with a lone surrogate is escaped (the manifest keeps it)."""
    return printable(text) if isinstance(text, str) else text


def merge(root: Path, chunks: int, title: str, page_size: int, caption: dict[str, Any],
          sampled: list[dict[str, Any]] | None = None) -> dict[str, int]:
    """manifest.jsonl + index.parquet + the gallery; returns the counts by status. `sampled`
    collects the rows the cache gate measured (cache_verdict.ROW_FIELD)."""
    counts: dict[str, int] = {}
    manifest = root / "manifest.jsonl"
    tmp = temps.opened(temps.temp_path(manifest))
    index = shards.IndexWriter(root / "index.parquet")

    def stream() -> Iterator[dict[str, Any]]:
        with open(tmp, "w") as out:
            for entry in entries(root, chunks):
                counts[entry.get("status", "")] = counts.get(entry.get("status", ""), 0) + 1
                if sampled is not None and cache_verdict.ROW_FIELD in entry:
                    sampled.append(entry)
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


def merge_job(runtime: RuntimeSpec, work: WorkPlan, jobfile: JobFile, claims: ClaimClient, layout: Layout,
              pending: Callable[[int], object], slowest_item_seconds: float, timings: dict[str, float],
              learned: dict[str, Any] | None = None) -> None:
    """The first pod's first rank: wait for every chunk, merge, and fail the job when its failed
    items say so. `pending`: this pod's ranks not done yet (it raises on a stalled one)."""
    start = time.perf_counter()
    # A hung rank of this pod holds its chunk forever: fail the pod (retried) instead of waiting.
    # Another pod's is the operator's to retry (its stall timeout); should no chunk finish for
    # the bound all the same, this pod fails and its retry claims the missing chunks itself.
    timeout = runtime.spec.parallelism.collective_timeout_seconds
    Tally(claims, lambda chunk: layouts.chunk_counts(read_part(jobfile.root, chunk) or [])).wait_all(
        work.chunks, pending, bound=merge_wait_bound(work, timeout, slowest_item_seconds),
        holder=lambda group: f"pod {group * layout.group_size // layout.local_world_size}")
    timings["waitSeconds"] = time.perf_counter() - start
    spec = runtime.spec
    caption = {"model": spec.model.name, "strategy": spec.parallelism.strategy,
               "scheduler": spec.generation.scheduler.name if spec.generation.scheduler else None,
               "adapters": [{"name": a.name, "scale": a.scale} for a in spec.model.adapters]}
    sampled: list[dict[str, Any]] = []
    counts = merge(jobfile.root, work.chunks, runtime.name, spec.output.gallery_page_size, caption, sampled)
    summary: dict[str, Any] = {**(learned or {}), "items": counts}
    if spec.generation.cache is not None and spec.generation.cache.verify is not None:
        summary["cacheVerify"] = cache_verdict.summarise(sampled, spec.generation.cache.verify.thresholds(),
                                                         cache_verdict.read_off(jobfile.root))
    jobfile.write(layout.describe(), timings, summary)
    # Merged: no temp of the tree is needed any more (a killed writer's, a slow duplicate's).
    if removed := temps.remove_all_in(layouts.tree(jobfile.root)):
        log.info("removed %d temp files left by killed or duplicate writers", len(removed))
    log.info("%s of %d items in %s", counts, work.total_items, jobfile.root)
    failed = counts.get("failed", 0)
    verdict = item_failures.merge_verdict(sum(counts.values()) - failed, failed)
    if verdict is not None:  # merged all the same: the manifest and the gallery say why each failed
        raise item_failures.failure(verdict, first_failed(jobfile.root, work.chunks))
