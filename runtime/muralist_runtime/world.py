"""Distributed setup: who am I, which group do I render with, and the process group itself.

The layout is pure arithmetic over (rank, world size, group size) so it can be unit-tested
without torch.distributed: ranks are cut into groups of `group_size` consecutive ranks (the
ranks of a ContextParallel / TensorParallel group stay inside one pod, because spec validation
makes the group size divide processesPerNode); the groups are data parallel.

Launchers: torchrun (and accelerate, which runs torchrun's elastic agent underneath) export
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK; a plain `python -m
muralist_runtime` without them is a world of one.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

from .spec.api import Parallelism
from .spec.contract import PermanentFailure


@dataclass(frozen=True)
class Layout:
    """Where this process sits in the job; everything derived from the torchrun environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    group_size: int

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def dp_degree(self) -> int:
        """Groups rendering different images."""
        return self.world_size // self.group_size

    @property
    def group_index(self) -> int:
        return self.rank // self.group_size

    @property
    def group_rank(self) -> int:
        return self.rank % self.group_size

    @property
    def writes_images(self) -> bool:
        """Only a group's first rank writes: its other ranks hold the same image."""
        return self.group_rank == 0

    def describe(self) -> dict[str, int]:
        return {
            "worldSize": self.world_size,
            "groupSize": self.group_size,
            "dataParallelDegree": self.dp_degree,
            "nodes": self.nodes,
            "processesPerNode": self.local_world_size,
        }


def layout_from_env(group_size: int, env: os._Environ[str] | dict[str, str] | None = None) -> Layout:
    env = os.environ if env is None else env
    world_size = int(env.get("WORLD_SIZE", "1"))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", str(world_size)))
    return Layout(
        rank=int(env.get("RANK", "0")),
        world_size=world_size,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_world_size=local_world_size,
        node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
        group_size=group_size,
    )


def check_layout(layout: Layout, parallelism: Parallelism) -> None:
    """The launcher's world must be the one the spec describes, or the shard plan is wrong."""
    if layout.world_size != parallelism.world_size:
        raise PermanentFailure(
            "spec.parallelism",
            f"the launcher started {layout.world_size} processes but nodes x processesPerNode = "
            f"{parallelism.world_size}; start the runtime with the spec's layout",
        )
    if layout.world_size % layout.group_size:
        raise PermanentFailure(
            "spec.parallelism",
            f"group size {layout.group_size} does not divide world size {layout.world_size}",
        )


@dataclass
class World:
    """The layout plus the live process group and this process's device."""

    layout: Layout
    device: Any  # torch.device; typed loosely so this module imports without torch
    backend: str
    distributed: bool

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
        """A device mesh over the whole world; consecutive ranks share the last dimensions."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, shape, mesh_dim_names=names)

    def close(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def setup_world(parallelism: Parallelism, group_size: int) -> World:
    """Initialise torch.distributed from the launcher's environment and pick the device.

    nccl for GPU tensors; gloo too (the combined backend) because barriers, object
    collectives and diffusers' CPU-side bookkeeping use CPU tensors. On CPU, gloo alone.
    Under `accelerate launch`, accelerate's PartialState owns the process group setup.
    """
    import torch
    import torch.distributed as dist

    gpu = has_gpu()
    timeout = datetime.timedelta(seconds=parallelism.collective_timeout_seconds)
    if parallelism.launcher == "accelerate":
        from accelerate import PartialState

        state = PartialState(cpu=not gpu, timeout=timeout)
        env = dict(os.environ)
        env.update(RANK=str(state.process_index), WORLD_SIZE=str(state.num_processes),
                   LOCAL_RANK=str(state.local_process_index))
        layout = layout_from_env(group_size, env)
        distributed = dist.is_available() and dist.is_initialized()
        backend = dist.get_backend() if distributed else "none"
    else:
        layout = layout_from_env(group_size)
        distributed = layout.world_size > 1
        backend = "cpu:gloo,cuda:nccl" if gpu else "gloo"
    check_layout(layout, parallelism)

    if gpu:
        torch.cuda.set_device(layout.local_rank)
        device = torch.device("cuda", layout.local_rank)
    else:
        device = torch.device("cpu")

    if distributed and not dist.is_initialized():
        # collectiveTimeoutSeconds bounds every collective: gloo raises in the calling thread
        # (main.py exits 1, retryable); NCCL's watchdog aborts the process when error
        # handling is on (3 = tear down without cleanup, torch's default, pinned here).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
        kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
        if gpu:
            # Binds the communicator to our GPU now, so barriers never guess the device.
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    return World(layout=layout, device=device, backend=backend, distributed=distributed)
