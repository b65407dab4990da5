"""Whose failure an exception is (render/failures.py): an item's, or the world's."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from muralist_runtime.render import failures


@pytest.mark.parametrize("error", [
    TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]"),
    ValueError("After adjusting the num_inference_steps by strength parameter: 0"),
    RuntimeError("The size of tensor a (12) must match the size of tensor b (16) at non-singleton dimension 1"),
    KeyError("image"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"),
    MemoryError(),
], ids=lambda e: type(e).__name__)
def test_an_items_own_failures(error: Exception) -> None:
    assert not failures.world_failure(error)


@pytest.mark.parametrize("error", [
    dist.DistBackendError("[../third_party/gloo] Timed out waiting 600000ms for recv operation to complete"),
    dist.DistNetworkError("Connection reset by peer"),
    torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("CUDA error: device-side assert triggered"),
    RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"),
], ids=lambda e: f"{type(e).__name__}:{str(e)[:20]}")
def test_failures_of_the_world(error: Exception) -> None:
    assert failures.world_failure(error)


def test_out_of_memory_is_worth_one_more_try() -> None:
    assert failures.out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert failures.out_of_memory(MemoryError())
    assert not failures.out_of_memory(ValueError("no"))


def test_a_reason_is_one_printable_line() -> None:
    error = TypeError("bad input 'a \ud83d'\nsecond line")
    assert failures.reason(error) == "TypeError: bad input 'a \\ud83d'"
    assert failures.reason(MemoryError()) == "MemoryError"
    assert len(failures.reason(ValueError("x" * 5000))) == failures.REASON_CHARS
