"""Whose failure an exception is: one item's, or the world's.

An exception raised while rendering an item (in its tokenizer, the pipeline, the VAE, a hook) fails
that item alone: the item is recorded as failed with its reason, counted against
runPolicy.maxFailedItems (work/item_failures.py), and the rank renders on. Out of memory is retried
once, the item alone, after the allocator's cache is given back. Only failures of the world fail the
rank (and so the pod, which is retried): a collective that broke or timed out (a rank of the group
is gone), or a device that is lost (a CUDA error other than out of memory leaves the context
unusable until the process ends). A bug that fails every item alike is caught by item_failures'
rule of the early chunks, not here.
"""

from __future__ import annotations

from muralist_api.items import printable

REASON_CHARS = 500
# A CUDA error other than out of memory poisons the context: nothing more runs in this process.
_LOST_DEVICE = ("CUDA error", "device-side assert", "NCCL", "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
                "CUBLAS_STATUS_EXECUTION_FAILED", "illegal memory access")


def world_failure(error: BaseException) -> bool:
    """A failure no other item would escape: the group's collectives, or the device."""
    import torch
    import torch.distributed as dist

    if isinstance(error, torch.OutOfMemoryError):
        return False
    if isinstance(error, dist.DistError | torch.AcceleratorError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(mark in text for mark in _LOST_DEVICE)


def out_of_memory(error: BaseException) -> bool:
    """Out of device memory (worth one more try, alone, once the cache is given back), or of host memory."""
    import torch

    return isinstance(error, torch.OutOfMemoryError | MemoryError)


def reason(error: BaseException) -> str:
    """An item's failure in one printable line: `TypeError: TextEncodeInput must be ...`."""
    text = f"{type(error).__name__}: {error}".splitlines()[0] if str(error) else type(error).__name__
    return printable(text)[:REASON_CHARS]


def release_memory() -> None:
    """Give the allocator's cached blocks back before an item is tried again."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
