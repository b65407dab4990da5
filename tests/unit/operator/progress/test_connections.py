"""The connection table's memory give-back (its limits and clocks are tested through a serving
endpoint, in test_http1)."""

from __future__ import annotations

import pytest
from muralist_operator.progress import connections as connections_module
from muralist_operator.progress.connections import Connections, Limits


def test_freed_memory_is_given_back_in_a_wave_of_closes_and_at_its_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(connections_module, "_MALLOC_TRIM", lambda pad: trims.append(pad) or 1)
    connections = Connections(Limits())
    keys = [object() for _ in range(1000)]

    def sweep_with(n_open: int) -> int:
        connections.open = dict.fromkeys(keys[:n_open])  # type: ignore[arg-type]
        before = len(trims)
        connections._give_back()
        return len(trims) - before

    assert sweep_with(1000) == 0  # a flood arrives: nothing to give back
    assert sweep_with(300) == 1  # 700 closed in one sweep
    assert sweep_with(200) == 0  # still closing, fewer than TRIM_AFTER_CLOSED since the last
    assert sweep_with(200) == 1  # the closing stopped: its tail goes back too
    assert sweep_with(200) == 0  # and only once
    assert sweep_with(190) == 0  # churn of a few connections costs no trim
    assert sweep_with(190) == 0
