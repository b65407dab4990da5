"""Each rank's compile record (model/compiling.py), told to the merge through the claim store.

Pods do not share a process group, and only the first pod's progress folder is the merging rank's, so a
group's first rank appends its group's records (one JSON line per rank, the rank's number in the whole job)
to the store every rank of every pod reaches: when its first size is compiled, before it claims a chunk, and
again after each later size, before the chunk that needed it is counted. The merge reads them once every
chunk is finished (`summary`); a rank's last line is its record (a retried pod's replaces the one before).
"""

from __future__ import annotations

import json
from typing import Any

from .claims import ClaimClient

COMPILED = "compiled"


def tell(client: ClaimClient, records: list[dict[str, Any]]) -> None:
    """Append ranks' records (each with its `rank`)."""
    client.append(COMPILED, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def summary(client: ClaimClient) -> dict[str, Any] | None:
    """The job file's `compile`: every rank's record by rank, and the job's compile seconds and cache hits
    at a glance; None when no rank compiled."""
    ranks: dict[int, dict[str, Any]] = {}
    for line in client.text(COMPILED).splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # an append cut with its connection: that rank's earlier line stands
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            ranks[record.pop("rank")] = record
    if not ranks:
        return None
    ordered = dict(sorted(ranks.items()))
    return {"cacheHits": sum(1 for r in ordered.values() if r.get("cacheHit")), "ranks": len(ordered),
            "maxSeconds": max(float(r.get("seconds", 0.0)) for r in ordered.values()),
            "byRank": {str(rank): record for rank, record in ordered.items()}}
