"""When failed items fail the job: three rules, as pure functions (render/claim_loop.py and main.py apply them).

An item fails on its own (a row that cannot be read, an input that cannot be read, an output
with NaN values, an out-of-memory error of one item) and the job goes on, within these rules:

1. Too many: more items failed job-wide than runPolicy.maxFailedItems allows (default 1% of
   the items). Checked each time a chunk ends, against the store's job-wide counters.
2. Systematic: the job's first chunks failed entirely. When a chunk ends and no item of the job
   has completed yet (rendered now, or kept from an earlier run) while at least 3 chunks holding
   at least 10 items have finished (muralist_api.pods.EARLY_FAILED_*, which the API documents), all of
   those items failed: a cause they share (a wrong column, a broken input volume, a dtype that
   gives NaN) would fail the rest alike, so the job stops instead of burning the data set,
   whatever maxFailedItems says. The store counts a chunk's completed items before the chunk
   itself (chunks.Tally.finished), so "no item completed" at the K-th finished chunk means the
   first K finished chunks, job-wide, all failed.
3. All failed: the merge finds items that failed and none that completed (a job too small for
   rule 2 to see). A job is never Succeeded with every item failed.

Each fails the job permanently (exit 78): retrying renders the same failures. The message
names the first failed items (key, id, reason); the manifest lists every one, and a later run
of the job retries only the failed and missing items.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from muralist_api.contract import PermanentFailure
from muralist_api.items import printable
from muralist_api.pods import DEFAULT_MAX_FAILED_ITEMS, EARLY_FAILED_CHUNKS, EARLY_FAILED_ITEMS, RunPolicy

# How many failed items a failure's message names (status.message and the termination message
# have room for a few, not for a list: the manifest has them all).
NAMED = 3
REASON_CHARS = 200
LIMIT_FIELD = "spec.runPolicy.maxFailedItems"
# Rules 2 and 3 have no single field at fault: the failed items' reasons say what to change.
ITEMS_FIELD = "items"


@dataclass(frozen=True)
class JobTally:
    """The store's job-wide counters as one chunk ended (chunks.Tally.finished)."""

    chunks: int  # chunks finished
    completed: int  # items rendered, or kept from an earlier run
    failed: int  # items failed


@dataclass(frozen=True)
class FailureVerdict:
    field: str
    message: str


def describe_item(key: str, id: str | None, reason: str | None) -> str:
    """`00002-000 (sku-2): column 'seed': seed 'x' is not an integer`, in one short line."""
    text = " ".join(printable(str(reason or "failed")).split())
    if len(text) > REASON_CHARS:
        text = text[: REASON_CHARS - 3] + "..."
    return f"{key}{f' ({printable(id)})' if id else ''}: {text}"


def systematic(t: JobTally) -> bool:
    """Rule 2: the first chunks finished with every item failed."""
    return t.completed == 0 and t.chunks >= EARLY_FAILED_CHUNKS and t.failed >= EARLY_FAILED_ITEMS


def chunk_verdict(t: JobTally, policy: RunPolicy, total: int) -> FailureVerdict | None:
    """Rules 2 and 1, when a chunk ends; None: the job goes on."""
    if systematic(t):
        return FailureVerdict(ITEMS_FIELD, f"no item completed: the first {t.chunks} chunks ({t.failed} items) all "
                              "failed, a systematic failure that the rest would share")
    limit = policy.failed_items_limit(total)
    if t.failed > limit:
        value = policy.max_failed_items
        share = f" ({value} of {total} items{', the default' if value == DEFAULT_MAX_FAILED_ITEMS else ''})" \
            if isinstance(value, str) else ""
        return FailureVerdict(LIMIT_FIELD, f"{t.failed} items failed, more than the {limit} allowed{share}")
    return None


def merge_verdict(completed: int, failed: int) -> FailureVerdict | None:
    """Rule 3, once every chunk is finished."""
    if failed and not completed:
        return FailureVerdict(ITEMS_FIELD, f"every item failed ({failed}), none completed")
    return None


def failure(verdict: FailureVerdict, first_failed: Iterable[str]) -> PermanentFailure:
    """The job's failure: the verdict, then the first failed items (describe_item lines)."""
    named = "; ".join(list(first_failed)[:NAMED])
    return PermanentFailure(verdict.field, f"{verdict.message}; first failed: {named or '-'}")
