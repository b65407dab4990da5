"""The plan of a job's work, made before the world exists: its rows, its chunks, its first item.

Before the world: a data set with no rows to render is a permanent failure of the spec, found by
every rank at once before any of them waits for the others to join.
"""

from __future__ import annotations

from muralist_api.contract import PermanentFailure
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec

from ..work import chunks, rows
from ..work.chunks import WorkPlan
from ..work.rows import Rows


def plan_work(runtime: RuntimeSpec) -> tuple[Rows, WorkPlan, Item]:
    """The job's rows, its plan of chunks, and its first item (the canary's and the warm-up's)."""
    spec = runtime.spec
    source_rows = rows.open_rows(runtime)
    plan_of_work = chunks.make_plan(spec, source_rows.count(), source_rows.start)
    if plan_of_work.rows == 0:
        raise PermanentFailure("spec.dataset", "no rows to render (check start and end)")
    first = rows.items_of(rows.peek(runtime), spec.generation)[0]
    return source_rows, plan_of_work, first
