"""`strategy: Auto` in the cluster: the plan made once from what the operator can see, then kept. Pure.

What it sees: the nodes a job's pods may land on (its podTemplate.nodeSelector), by the labels of
NVIDIA's GPU feature discovery (`nvidia.com/gpu.memory`, `.product`, `.machine`) and a
`muralist.dev/interconnect` label (muralist_api/planner/device.py); without GPU labels, the pods'
resources: a job without GPUs plans its processes within `resources.limits.memory` (or requests), shared
by them. The model's sizes are the planner's catalog's (planner/known.py): the operator reads no model
files; a model the catalog does not name is planned by its objective alone, and its pods confirm the
plan against the real headers before loading (runtime plan/confirm.py).

The plan goes into status.parallelPlan when the job is first reconciled, with a Planned condition and
event saying it in a line, and every later reconcile (a resize, a Job created again) renders the same
layout from it: the nodes' labels changing later never changes a running job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from muralist_api.job import DiffusionJob, Strategy
from muralist_api.planner.device import GPU_MEMORY_LABEL, Device, from_node_labels, parse_size
from muralist_api.planner.known import known_facts
from muralist_api.planner.record import ParallelPlan
from muralist_api.planner.table import plan_job, planned
from muralist_api.status import DiffusionJobStatus

from muralist_operator.decision import Decision, Event, find_condition, set_condition

CONDITION = "Planned"
REASON = "AutoPlanned"
REASON_CANNOT_PLAN = "CannotPlan"


def is_auto(job: DiffusionJob) -> bool:
    return job.spec.parallelism.strategy == Strategy.AUTO


def node_selector(job: DiffusionJob) -> str:
    """A label selector of the nodes a job's pods may land on: its nodeSelector, and GPU feature
    discovery's memory label when it asks for GPUs."""
    parts = [f"{k}={v}" for k, v in sorted((job.spec.pod_template.node_selector or {}).items())]
    if job.spec.parallelism.gpus_per_node > 0:
        parts.append(GPU_MEMORY_LABEL)
    return ",".join(parts)


def _memory_limit(resources: Mapping[str, object]) -> int | None:
    for part in ("limits", "requests"):
        values = resources.get(part)
        memory = values.get("memory") if isinstance(values, Mapping) else None
        if memory:
            try:
                return parse_size(str(memory))
            except ValueError:
                return None
    return None


def device_for(job: DiffusionJob, nodes: Sequence[Mapping[str, str]]) -> Device:
    """The devices a pod of this job gets, from the labels of the nodes it may land on, else from its
    resources."""
    par = job.spec.parallelism
    if par.gpus_per_node > 0:
        labelled = from_node_labels(nodes, par.gpus_per_node)
        if labelled is not None:
            return labelled
        return Device(par.gpus_per_node, 0, "pcie" if par.gpus_per_node > 1 else "none", True, "",
                      f"no node the pods may land on has {GPU_MEMORY_LABEL}: the GPUs' memory is unknown")
    processes = par.processes_per_node or 1
    limit = _memory_limit(job.spec.resources)
    if limit is None:
        return Device(processes, 0, "none", False, "", "no GPUs and no resources.limits.memory: memory unknown")
    return Device(processes, limit // processes, "none", False, "",
                  f"resources memory {job.spec.resources.get('limits', {}).get('memory') or 'request'} shared by "
                  f"{processes} process(es)")


def plan_for(job: DiffusionJob, nodes: Sequence[Mapping[str, str]]) -> ParallelPlan:
    """The plan of an Auto job (raises planner.table.CannotPlan)."""
    facts = known_facts(job.spec.model.name)
    return plan_job(job.spec, facts, device_for(job, nodes))


def apply(job: DiffusionJob, plan: ParallelPlan) -> DiffusionJob:
    """The job as planned: spec.parallelism the plan's, the plan in its status (the runtime spec carries it)."""
    status = (job.status or DiffusionJobStatus()).model_copy(update={"parallel_plan": plan})
    return job.model_copy(update={"spec": planned(job.spec, plan), "status": status})


def message(plan: ParallelPlan) -> str:
    return f"{plan.objective}: {plan.summary}; " + "; ".join(plan.reasons)


def note(decision: Decision, plan: ParallelPlan, now: datetime, generation: int | None) -> None:
    """The Planned condition (`kubectl describe`, `kubectl get -o yaml`), and its event once."""
    conditions = decision.status.conditions
    text = message(plan)[:2000]
    existing = find_condition(conditions, CONDITION)
    if existing is None:
        decision.events.append(Event("Normal", REASON, text[:1000]))
    set_condition(conditions, CONDITION, True, REASON, text, now, generation)
