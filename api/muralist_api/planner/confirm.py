"""What a pod's measurements must confirm of an Auto plan, and the estimate of any job's layout.

A plan is made from what the operator (or `muralist run`) could see: the nodes' labels, the planner's
catalog figures. Each rank, before loading, reads the model's real sizes and measures its devices
(runtime plan/confirm.py); `confirm_problems` says when those contradict the plan: the layout's
estimated peak over the memory measured free, or NVLink assumed where the GPUs cannot reach each
other. `layout_estimate` is the estimate per device of any concrete layout, which the job file records
beside the measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from muralist_api.job import DiffusionJobSpec
from muralist_api.planner.device import gib
from muralist_api.planner.facts import ModelFacts
from muralist_api.planner.memory import MemoryEstimate, estimate, usable
from muralist_api.planner.record import ParallelPlan
from muralist_api.planner.table import placement, workload_of
from muralist_api.rules.catalog import Problem


@dataclass(frozen=True)
class Measured:
    """What a rank measured before loading: the least free memory of the devices it will use, and
    whether its pod's GPUs can reach each other's memory directly (None: not measured)."""

    free_memory: int
    peer_access: bool | None = None
    what: str = "free memory"  # how free_memory was measured, for the message


def confirm_problems(plan: ParallelPlan, facts: ModelFacts | None, spec: DiffusionJobSpec,
                     measured: Measured) -> list[Problem]:
    """A plan the pod's measurements contradict: the layout's estimate (from the real files when
    `facts` could be read) over what is free, or NVLink assumed where the GPUs cannot reach each
    other. Empty: confirmed."""
    out: list[Problem] = []
    if plan.interconnect == "nvlink" and measured.peer_access is False and \
            plan.parallelism.get("strategy") == "TensorParallel":
        out.append(("spec.parallelism", f"the plan ({plan.summary}) assumed NVLink between the pod's GPUs, but they "
                    "cannot access each other's memory (torch.cuda.can_device_access_peer is False): set the node's "
                    "muralist.dev/interconnect label to pcie, or choose the strategy yourself"))
    peak = _confirmed_peak(plan, facts, spec)
    room = usable(measured.free_memory)
    if peak is not None and peak > room:
        out.append(("spec.parallelism", f"the plan ({plan.summary}) needs an estimated {gib(peak)} per device, but "
                    f"this pod measured {gib(measured.free_memory)} of {measured.what} ({gib(room)} usable); "
                    f"planned for {plan.device}: give the job devices with more memory, or choose the strategy "
                    "yourself (`muralist plan` shows the figures)"))
    return out


def layout_estimate(facts: ModelFacts, spec: DiffusionJobSpec) -> MemoryEstimate:
    """The estimate per device of a job's (concrete) layout: the most loaded device."""
    work = workload_of(spec)
    par = spec.parallelism
    weights = facts.total_bytes(work.dtype)
    if par.strategy == "TensorParallel" and facts.denoiser is not None:
        t = par.group_size
        big = facts.denoiser.bytes_at(work.dtype)
        return estimate(facts, work, weights - big + big // t, split_tensors=t)
    if par.strategy == "DeviceMap" and par.gpus_per_node > 1:
        return placement(facts, work, par.gpus_per_node).estimate()
    return estimate(facts, work, weights, split_sequence=par.group_size)


def _confirmed_peak(plan: ParallelPlan, facts: ModelFacts | None, spec: DiffusionJobSpec) -> int | None:
    """The plan's peak per device, again from the real files where they could be read."""
    if facts is not None:
        return layout_estimate(facts, spec).peak
    return plan.memory.peak_bytes if plan.memory is not None else None
