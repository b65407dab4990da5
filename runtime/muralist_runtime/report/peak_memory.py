"""A rank's peak memory, as the job file records it beside the planner's estimate.

On a GPU, what PyTorch's allocator held at most on this rank's device
(`torch.cuda.max_memory_allocated`: the figure the estimate of weights, activations and decode is
about); without one, this process's peak resident memory (VmHWM), which also counts the interpreter
and the libraries.
"""

from __future__ import annotations

import sys
from pathlib import Path

MIB = 1 << 20
VMHWM = "VmHWM"
CUDA_PEAK = "torch.cuda.max_memory_allocated"


def vmhwm_mib() -> float:
    """This process's peak resident memory (VmHWM); 0 where /proc has no such line."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{VMHWM}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def peak_mib() -> tuple[float, str]:
    """(this rank's peak in MiB, how it was measured)."""
    torch = sys.modules.get("torch")  # loaded by then on any rank that renders; never imported just for this
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / MIB, CUDA_PEAK
    return vmhwm_mib(), VMHWM
