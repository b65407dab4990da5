"""The devices a plan is made for: sizes as people write them, and GPU feature discovery's node labels."""

from __future__ import annotations

import pytest
from muralist_api.planner.device import BadSize, from_node_labels, gib, interconnect_of, parse_size

H100 = {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
L40S = {"nvidia.com/gpu.memory": "46068", "nvidia.com/gpu.product": "NVIDIA-L40S"}


@pytest.mark.parametrize(("text", "size"), [
    ("80GiB", 80 << 30), ("80Gi", 80 << 30), ("24G", 24 * 10**9), ("24GB", 24 * 10**9), ("512MiB", 512 << 20),
    ("81559Mi", 81559 << 20), ("1.5GiB", 3 << 29), ("1024", 1024)])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "80 GiBs", "-1G", ""])
def test_a_size_that_is_not_one_says_how_to_write_it(text: str) -> None:
    with pytest.raises(BadSize, match="write it like 80GiB"):
        parse_size(text)


def test_gib_for_people() -> None:
    assert (gib(80 << 30), gib(512 << 20), gib(5 << 19), gib(300 << 10)) == ("80.0 GiB", "512 MiB", "2.5 MiB",
                                                                            "300 KiB")


@pytest.mark.parametrize(("labels", "link"), [
    ({"muralist.dev/interconnect": "pcie", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "pcie"),
    ({"muralist.dev/interconnect": "NVLink"}, "nvlink"),
    (H100, "nvlink"),  # the SXM board's HBM3 H100
    ({"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"}, "pcie"),
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, "nvlink"),
    ({"nvidia.com/gpu.machine": "DGX-H100"}, "nvlink"),
    (L40S, None),
])
def test_the_interconnect_from_a_nodes_labels(labels: dict[str, str], link: str | None) -> None:
    assert interconnect_of(labels)[0] == link


def test_the_least_node_and_the_slowest_link_are_planned_for() -> None:
    device = from_node_labels([H100, L40S], gpus=4)
    assert device is not None
    assert (device.memory, device.interconnect, device.product) == (46068 << 20, "pcie", "NVIDIA-L40S")
    assert "nvidia.com/gpu.memory=46068" in device.source
    nvlink = from_node_labels([H100, {**H100, "muralist.dev/interconnect": "nvlink"}], gpus=8)
    assert nvlink is not None and nvlink.interconnect == "nvlink" and nvlink.count == 8
    one = from_node_labels([H100], gpus=1)
    assert one is not None and one.interconnect == "none"  # one GPU per pod: nothing to link
    assert from_node_labels([{"kubernetes.io/os": "linux"}], gpus=1) is None
