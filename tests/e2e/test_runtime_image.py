"""The runtime image the real node runs, run directly: what a pod needs of it beyond Python packages.

generation.compile builds kernels inside the pod (inductor's C++ kernels on a CPU, Triton's launcher on a GPU), so
the image must carry a C++ compiler and Python's headers; an image without them fails every compiled job at its
first call. The same restrictions as a pod's: a read-only root, /tmp writable (an emptyDir: not noexec, as
Docker's --tmpfs is by default) and HOME there, no capabilities.
"""

from __future__ import annotations

import math

import pytest

from tests.docker_plugin import Docker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

COMPILED = """
import torch
f = torch.compile(lambda x: (x.sin() * 2 + 1).sum(), backend="inductor")
print(float(f(torch.ones(8))))
"""


def test_the_runtime_image_compiles_with_torch_compile(docker: Docker, runtime_image: str) -> None:
    flags = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--tmpfs", "/tmp:exec",
             "-e", "HOME=/tmp", "--network", "none", "--entrypoint", "python"]
    proc = docker("run", "--rm", *flags, runtime_image, "-c", COMPILED, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert math.isclose(float(proc.stdout.split()[-1]), 8 * (2 * math.sin(1) + 1), rel_tol=1e-5), proc.stdout
