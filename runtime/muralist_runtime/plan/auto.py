"""`strategy: Auto` on one machine: the model's facts and this machine's devices, for `muralist run` and
`muralist plan`.

The model's sizes come from its files where they can be read (model/sizes.py: a local folder's
safetensors headers, a hub repo's by ranged reads), else from the planner's catalog (the public
models the docs use, the built-in tiny ones). The devices are what the command line says
(`--gpu-memory`, `--interconnect`), else what this machine shows: the GPUs' memory from `nvidia-smi`,
or, without GPUs, the memory available now shared by the processes. Torch-free: `muralist run`
plans before it starts any process.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from muralist_api.job import DiffusionJobSpec
from muralist_api.planner.device import MIB, Device, Interconnect, parse_size
from muralist_api.planner.facts import ModelFacts
from muralist_api.planner.known import known_facts
from muralist_api.rules.catalog import TINY_MODEL_NAMES

from ..model.resolve import tiny_cache_dir
from ..model.sizes import read_facts
from .confirm import mem_available

log = logging.getLogger("muralist")


def model_facts(spec: DiffusionJobSpec, model_path: str | None = None) -> ModelFacts | None:
    """The model's facts from its files (a local folder, `model_path`, a hub repo), else the catalog's."""
    name = spec.model.name
    where = model_path or (str(tiny_cache_dir(name)) if name in TINY_MODEL_NAMES else name)
    if Path(where).is_dir() or name not in TINY_MODEL_NAMES:
        try:
            return read_facts(where, spec.model.revision)
        except Exception as e:  # the catalog's figures stand in for files that cannot be read
            known = known_facts(name)
            log.info("cannot read the sizes of %s (%s: %s)%s", where, type(e).__name__, str(e)[:200],
                     "; using the planner's catalog figures" if known else "")
            return known
    return known_facts(name)


def _nvidia_smi_memory() -> int | None:
    """The least total memory of this machine's GPUs (nvidia-smi), in bytes; None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        values = [int(v) for v in out.split() if v.strip().isdigit()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(values) * MIB if values else None


def local_device(spec: DiffusionJobSpec, gpu_memory: str | None = None,
                 interconnect: Interconnect | None = None) -> Device:
    """This machine's devices for the job: its GPUs (gpusPerNode of them), or its CPU processes."""
    par = spec.parallelism
    given = parse_size(gpu_memory) if gpu_memory else None
    if par.gpus_per_node > 0:
        memory = given or _nvidia_smi_memory() or 0
        said = "--gpu-memory" if given else ("nvidia-smi" if memory else "unknown: no --gpu-memory, no nvidia-smi")
        link: Interconnect = interconnect or "pcie"
        said += "; interconnect " + ("--interconnect" if interconnect else "not given: PCIe assumed")
        return Device(par.gpus_per_node, memory, link if par.gpus_per_node > 1 else "none", True, "", said)
    processes = par.processes_per_node or 1
    if given:
        return Device(processes, given, "none", False, "", "--gpu-memory, a budget per process")
    available = mem_available() or 0
    return Device(processes, available // processes, "none", False, "",
                  f"this machine's available memory shared by {processes} process(es)")
