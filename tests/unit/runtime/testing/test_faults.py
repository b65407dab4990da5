"""The slow rank's compute knob (MURALIST_TEST_STEP_REPEAT): each denoiser call runs k times on
that rank only, through the class's forward (past instance hooks), and only within the block."""

from __future__ import annotations

import pytest
import torch
from muralist_api import contract
from muralist_runtime.testing import faults


class Denoiser(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor, *, scale: float) -> torch.Tensor:
        self.calls += 1
        return x * scale + self.calls  # a later call's result differs: the first one must be kept


class Pipe:
    def __init__(self) -> None:
        self.transformer = Denoiser()


def test_each_step_runs_k_times_and_keeps_the_first_result() -> None:
    pipe = Pipe()
    with faults.repeated_steps(pipe, 3):
        out = pipe.transformer(torch.ones(2), scale=2.0)
    assert pipe.transformer.calls == 3
    assert torch.equal(out, torch.full((2,), 3.0))
    pipe.transformer(torch.ones(2), scale=2.0)
    assert pipe.transformer.calls == 4, "the hook is gone after the block"


def test_only_the_slow_rank_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.MURALIST_TEST_STEP_REPEAT, "2")
    monkeypatch.setenv(contract.MURALIST_TEST_SLOW_RANK, "1")
    assert (faults.step_repeat(0), faults.step_repeat(1)) == (1, 2)
    monkeypatch.delenv(contract.MURALIST_TEST_STEP_REPEAT)
    assert faults.step_repeat(1) == 1
