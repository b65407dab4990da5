"""Distributed setup: who am I, which group do I render with, and the process group itself.

Two scopes. The job: every process of every pod has a rank in it (pod index x processes per
pod + local rank), and ranks are cut into groups of `group_size` consecutive ranks that render
one image together (ContextParallel / TensorParallel; 1 for DataParallel and DeviceMap); the
groups are data parallel and claim their work from the store (work/chunks.py). The torchrun world:
the pod alone, or the pods of a context-parallel group that spans pods (muralist_api/contract/pod.py:
`pod_world`): its process group carries only that group's collectives, so a failed pod costs
only its own world.

The layout is pure arithmetic over the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK) and MURALIST_POD_INDEX, so it is unit-tested without
torch.distributed; a plain `python -m muralist_runtime` without them is a world of one.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

from muralist_api import contract
from muralist_api.contract import PermanentFailure
from muralist_api.contract.env import LOCAL_RANK, RANK, WORLD_SIZE, PodEnv
from muralist_api.job import Parallelism


@dataclass(frozen=True)
class Layout:
    """Where this process sits, in the job and in its torchrun world."""

    pod_index: int
    local_rank: int
    local_world_size: int  # processes in this pod
    nodes: int  # pods in the job
    group_size: int
    pg_rank: int  # in this torchrun world
    pg_size: int

    @property
    def rank(self) -> int:
        """In the whole job: the same number whichever world the process is in."""
        first_pod = self.pod_index - self.pg_rank // self.local_world_size
        return first_pod * self.local_world_size + self.pg_rank

    @property
    def world_size(self) -> int:
        return self.nodes * self.local_world_size

    @property
    def dp_degree(self) -> int:
        """Groups rendering different images, in the whole job."""
        return self.world_size // self.group_size

    @property
    def group_index(self) -> int:
        return self.rank // self.group_size

    @property
    def group_rank(self) -> int:
        return self.rank % self.group_size

    @property
    def pg_groups(self) -> int:
        """Groups inside this torchrun world."""
        return self.pg_size // self.group_size

    @property
    def pg_group_first(self) -> int:
        """The torchrun rank of this group's first rank."""
        return self.pg_rank - self.group_rank

    @property
    def writes_images(self) -> bool:
        """Only a group's first rank writes: its other ranks hold the same image."""
        return self.group_rank == 0

    @property
    def hosts_store(self) -> bool:
        """The first process of the first pod hosts the work-claim store and merges at the end."""
        return self.pod_index == 0 and self.local_rank == 0

    def describe(self) -> dict[str, int]:
        return {
            "worldSize": self.world_size,
            "groupSize": self.group_size,
            "dataParallelDegree": self.dp_degree,
            "nodes": self.nodes,
            "processesPerNode": self.local_world_size,
            "podsPerWorld": self.pg_size // self.local_world_size,
        }


def layout_from_env(group_size: int, nodes: int, env: PodEnv | None = None) -> Layout:
    env = PodEnv.from_environ() if env is None else env
    return Layout(
        pod_index=env.pod_index,
        local_rank=env.local_rank,
        local_world_size=env.local_world_size,
        nodes=nodes,
        group_size=group_size,
        pg_rank=env.rank,
        pg_size=env.world_size,
    )


def check_layout(layout: Layout, parallelism: Parallelism) -> None:
    """The launcher's world must be the one the spec describes, or the work plan is wrong."""
    ppn = parallelism.resolved_processes_per_node
    expected = contract.pods_per_world(layout.group_size, ppn) * ppn
    if layout.local_world_size != ppn or layout.pg_size != expected:
        raise PermanentFailure(
            "spec.parallelism",
            f"the launcher started {layout.local_world_size} processes per pod in a world of {layout.pg_size}, "
            f"but the spec says {ppn} per pod in worlds of {expected}; start it with the pod contract's command",
        )
    if layout.pg_size % layout.group_size:
        raise PermanentFailure("spec.parallelism",
                               f"group size {layout.group_size} does not divide world size {layout.pg_size}")


@dataclass
class DistributedWorld:
    """The layout plus the live process group and this process's device."""

    layout: Layout
    device: Any  # torch.device; typed loosely so this module imports without torch
    backend: str
    distributed: bool
    group: Any = None  # this group's process group (None for groups of one)

    def mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
        """A device mesh over this torchrun world; consecutive ranks share the last dimensions."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, shape, mesh_dim_names=names)

    def share_in_group(self, value: Any) -> Any:
        """The group's first rank's `value`, on every rank of the group (a claimed chunk)."""
        if self.group is None:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=self.layout.pg_group_first, group=self.group)
        return box[0]

    def gather_in_group(self, value: Any) -> list[Any]:
        """Every rank's `value`, in group order, on every rank of the group (each rank's outcome of a call)."""
        if self.group is None:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.layout.group_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def close(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


def uses_gpu(parallelism: Parallelism) -> bool:
    """Whether this job runs on GPUs here: it asks for them and the pod sees some. A CPU job
    (gpusPerNode 0) stays on the CPU on a GPU host too."""
    return parallelism.gpus_per_node > 0 and has_gpu()


def check_devices(layout: Layout) -> None:
    """Each local rank needs a GPU of its own."""
    import torch

    count = torch.cuda.device_count()
    if layout.local_world_size > count:
        raise PermanentFailure(
            "spec.parallelism.gpusPerNode",
            f"{layout.local_world_size} processes per pod, one per GPU, but this pod sees {count} GPU(s); "
            "request as many GPUs as processes (resources, gpusPerNode)",
        )


def _group_process_group(layout: Layout) -> Any:
    """Every rank creates every group of its world (new_group is collective); keeps its own."""
    import torch.distributed as dist

    mine = None
    for g in range(layout.pg_groups):
        ranks = list(range(g * layout.group_size, (g + 1) * layout.group_size))
        pg = dist.new_group(ranks)
        if layout.pg_rank in ranks:
            mine = pg
    return mine


def setup_world(parallelism: Parallelism, group_size: int) -> DistributedWorld:
    """Initialise torch.distributed from the launcher's environment and pick the device.

    nccl for GPU tensors; gloo too (the combined backend) because barriers, object
    collectives and diffusers' CPU-side bookkeeping use CPU tensors. On CPU, gloo alone.
    Under `accelerate launch`, accelerate's PartialState owns the process group setup.
    """
    import torch
    import torch.distributed as dist

    gpu = uses_gpu(parallelism)
    timeout = datetime.timedelta(seconds=parallelism.collective_timeout_seconds)
    if parallelism.launcher == "accelerate":
        from accelerate import PartialState

        state = PartialState(cpu=not gpu, timeout=timeout)
        # accelerate's own count of the processes, as torchrun would have set it.
        env = PodEnv.from_environ({**os.environ, RANK: str(state.process_index), WORLD_SIZE: str(state.num_processes),
                                   LOCAL_RANK: str(state.local_process_index)})
        layout = layout_from_env(group_size, parallelism.nodes, env)
        distributed = dist.is_available() and dist.is_initialized()
        backend = dist.get_backend() if distributed else "none"
    else:
        layout = layout_from_env(group_size, parallelism.nodes)
        distributed = layout.pg_size > 1
        backend = "cpu:gloo,cuda:nccl" if gpu else "gloo"
    check_layout(layout, parallelism)

    if gpu:
        check_devices(layout)
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
    group = _group_process_group(layout) if distributed and group_size > 1 else None
    return DistributedWorld(layout=layout, device=device, backend=backend, distributed=distributed, group=group)
