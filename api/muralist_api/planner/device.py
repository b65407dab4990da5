"""The devices a plan is made for: how many per pod, how much memory each, how they are linked.

Three places say it: the user (`muralist plan --gpus-per-node N --gpu-memory SIZE --interconnect
nvlink|pcie`, `muralist run --gpu-memory`), the nodes (the labels NVIDIA's GPU feature discovery
sets: `nvidia.com/gpu.memory` in MiB, `nvidia.com/gpu.product`, `nvidia.com/gpu.machine`; the
interconnect from a `muralist.dev/interconnect` label, else from the product and machine names),
and, for a job without GPUs, the pod's own memory limit shared by its processes. Each `Device`
says where its figures came from, so a plan's reasons can quote them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Interconnect = Literal["nvlink", "pcie", "none"]

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, per GPU
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MACHINE_LABEL = "nvidia.com/gpu.machine"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
INTERCONNECT_LABEL = "muralist.dev/interconnect"  # nvlink | pcie, set by whoever knows the node's links

GIB = 1 << 30
MIB = 1 << 20
_UNITS = {
    "": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30,
    "ti": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20,
    "gib": 1 << 30, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
# Product or machine names of boards whose GPUs talk over NVLink (SXM modules, HGX/DGX boards).
_NVLINK_NAMES = re.compile(r"SXM|HGX|DGX|HBM3|GB200|GH200|NVL|p4d|p4de|p5|a3-|nd96|nd-h", re.IGNORECASE)
_PCIE_NAMES = re.compile(r"PCIe", re.IGNORECASE)


class BadSize(ValueError):
    pass


def parse_size(text: str) -> int:
    """Bytes of "80GiB", "80Gi", "24G", "81559Mi", "512MiB": a Kubernetes quantity or the same with B."""
    match = _SIZE.match(str(text))
    unit = match[2].lower() if match else ""
    if match is None or unit not in _UNITS:
        raise BadSize(f"{text!r} is not a size; write it like 80GiB, 80Gi, 24G or 512MiB")
    return int(float(match[1]) * _UNITS[unit])


def gib(size: int | float) -> str:
    """A size for people: 23.8 GiB, 512 MiB, 2.5 MiB, 300 KiB."""
    if abs(size) >= GIB:
        return f"{size / GIB:.1f} GiB"
    if abs(size) < MIB:
        return f"{size / 1024:.0f} KiB"
    return f"{size / MIB:.1f} MiB" if abs(size) < 10 * MIB else f"{size / MIB:.0f} MiB"


@dataclass(frozen=True)
class Device:
    """`count` devices per pod (GPUs, or CPU processes when `gpu` is False) of `memory` bytes each."""

    count: int
    memory: int
    interconnect: Interconnect
    gpu: bool = True
    product: str = ""
    source: str = ""

    def describe(self) -> str:
        what = f"{self.count} x {self.product or ('GPU' if self.gpu else 'CPU process')}"
        link = {"nvlink": ", NVLink", "pcie": ", PCIe", "none": ""}[self.interconnect]
        return f"{what}, {gib(self.memory)} each{link}" + (f" ({self.source})" if self.source else "")


def interconnect_of(labels: Mapping[str, str]) -> tuple[Interconnect | None, str]:
    """(the interconnect a node's labels say, which label said it); None when they do not say."""
    value = labels.get(INTERCONNECT_LABEL, "").strip().lower()
    if value in ("nvlink", "pcie"):
        return value, INTERCONNECT_LABEL  # type: ignore[return-value]
    for label in (GPU_PRODUCT_LABEL, GPU_MACHINE_LABEL):
        name = labels.get(label, "")
        if _NVLINK_NAMES.search(name):
            return "nvlink", f"{label}={name}"
        if _PCIE_NAMES.search(name):
            return "pcie", f"{label}={name}"
    return None, ""


def from_node_labels(nodes: Iterable[Mapping[str, str]], gpus: int) -> Device | None:
    """The device of the least of the nodes that carry GPU feature discovery's memory label (a pod may
    land on any of them); None when none does. A node whose interconnect no label says counts as PCIe
    (the slower: no plan then relies on NVLink)."""
    labelled = [n for n in nodes if _mib(n.get(GPU_MEMORY_LABEL)) is not None]
    if not labelled:
        return None
    least = min(labelled, key=lambda n: _mib(n.get(GPU_MEMORY_LABEL)) or 0)
    links = [interconnect_of(n) for n in labelled]
    if all(link == "nvlink" for link, _ in links):
        interconnect: Interconnect = "nvlink"
        said = links[0][1]
    else:
        interconnect = "pcie"
        said = next((by for link, by in links if link == "pcie"), "") or "no label says NVLink"
    memory = (_mib(least.get(GPU_MEMORY_LABEL)) or 0) * MIB
    nodes_said = f"{len(labelled)} node(s): {GPU_MEMORY_LABEL}={least.get(GPU_MEMORY_LABEL)}; {said}"
    return Device(gpus, memory, interconnect if gpus > 1 else "none", True, least.get(GPU_PRODUCT_LABEL, ""),
                  f"node labels of {nodes_said}")


def _mib(value: str | None) -> int | None:
    try:
        mib = int(str(value).strip())
    except ValueError:
        return None
    return mib if mib > 0 else None
