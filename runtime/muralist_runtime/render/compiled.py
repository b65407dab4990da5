"""The claim loop's side of generation.compile: a size's first call, and each rank's compile record told to the
merge (work/compile_records.py) whenever it changes.

Every rank of a group renders the same batches, so every rank meets a new size at the same call: the group's
records are gathered there, and its first rank (the one with a claim client) tells them to the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from muralist_api.items import Shape

from ..run_state import RunState
from ..work import compile_records


def tell_records(state: RunState) -> None:
    """This group's compile records to the store (a collective in a group: every rank calls it)."""
    if state.compiled is None:
        return
    mine = {"rank": state.world.layout.rank, **state.compiled.record.to_json()}
    records = state.world.gather_in_group(mine)
    if state.writes:
        compile_records.tell(state.claims, records)


@contextmanager
def compiled_size(state: RunState, shape: Shape) -> Iterator[None]:
    """Around a call of `shape`: its size compiled (or loaded from the compile cache) at the first such call,
    and the records told again when it was new."""
    compiled = state.compiled
    if compiled is None or shape.describe() in compiled.record.sizes:
        yield
        return
    with compiled.first_call(shape):
        yield
    tell_records(state)
