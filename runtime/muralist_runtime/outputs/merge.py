"""The end of a job: one manifest, one Parquet index and a paginated gallery, as a stream.

The first pod's first rank runs this once every chunk is finished (work/chunks.py: `Tally.wait_all`): no
world-wide barrier, since pods do not share a process group. It reads the chunk part files in
chunk order (each sorted by item), so the outputs come out in item order without ever holding
more than one chunk: a million-item job merges in one pass, with no quadratic step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from ..work.item_failures import NAMED, describe_item
from . import shards, temps
from .gallery import write_gallery
from .layouts import read_part


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
        "id": entry.get("id"),
        "key": entry.get("key"),
        "prompt": entry.get("prompt"),
        "seed": entry.get("seed"),
        "shard": int(Path(shard).stem.split("-")[1]) if shard else None,
        "status": entry.get("status"),
        "seconds": entry.get("seconds"),
        "error": entry.get("error"),
    }


def merge(root: Path, chunks: int, title: str, page_size: int, caption: dict[str, Any]) -> dict[str, int]:
    """manifest.jsonl + index.parquet + the gallery; returns the counts by status."""
    counts: dict[str, int] = {}
    manifest = root / "manifest.jsonl"
    tmp = temps.opened(temps.temp_path(manifest))
    index = shards.IndexWriter(root / "index.parquet")

    def stream() -> Iterator[dict[str, Any]]:
        with open(tmp, "w") as out:
            for entry in entries(root, chunks):
                counts[entry.get("status", "")] = counts.get(entry.get("status", ""), 0) + 1
                out.write(json.dumps(entry, sort_keys=True) + "\n")
                index.write(index_row(entry))
                yield entry
            out.flush()

    try:
        write_gallery(root, title, stream(), page_size=page_size, caption=caption)
        temps.publish(tmp, manifest, sync_dir=False)  # derived from the part files: rewritten by a rerun
        index.close()
    except BaseException:
        index.abort()
        tmp.unlink(missing_ok=True)
        temps.closed(tmp)
        raise
    return counts
