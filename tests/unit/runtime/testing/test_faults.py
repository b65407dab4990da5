"""The slow rank's compute knob (MURALIST_TEST_RENDER_REPEAT) applies to that rank only."""

from __future__ import annotations

import pytest
from muralist_api import contract
from muralist_runtime.testing import faults


def test_only_the_slow_rank_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.MURALIST_TEST_RENDER_REPEAT, "2")
    monkeypatch.setenv(contract.MURALIST_TEST_SLOW_RANK, "1")
    assert (faults.render_repeat(0), faults.render_repeat(1)) == (1, 2)
    monkeypatch.delenv(contract.MURALIST_TEST_RENDER_REPEAT)
    assert faults.render_repeat(1) == 1
