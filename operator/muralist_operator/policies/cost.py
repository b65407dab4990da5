"""What a job's outputs cost: GPU-seconds so far and per item, and at a price per GPU-hour the cost so far
and the estimate to finish (status.cost).

GPU-seconds accrue while pods run: each reconcile adds the GPUs of the pods that were running at the
last accounting times the time since (the pods' GPUs: gpusPerNode; processes for a job without GPUs),
then counts the pods running now. Pods start and stop through events that reconcile the job, so the
count holds between accountings. Per item: over the items this job rendered (kept ones cost nothing).
The price: the job's `muralist.dev/price-per-gpu-hour` annotation, else the operator's setting
(`--price-per-gpu-hour`, the chart's `pricing.pricePerGpuHour`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from muralist_api.job import DiffusionJob
from muralist_api.status import Cost, DiffusionJobStatus

PRICE_ANNOTATION = "muralist.dev/price-per-gpu-hour"


def price(job: DiffusionJob, default: float | None) -> float | None:
    """The job's annotation, else the operator's price; None when neither says (or says no number)."""
    annotations = (job.metadata.model_extra or {}).get("annotations") or {}
    text = annotations.get(PRICE_ANNOTATION) if isinstance(annotations, Mapping) else None
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    return value if value >= 0 else default


def devices_per_pod(job: DiffusionJob) -> int:
    par = job.spec.parallelism
    return par.gpus_per_node if par.gpus_per_node > 0 else par.resolved_processes_per_node


def account(status: DiffusionJobStatus, job: DiffusionJob, running_pods: int, per_hour: float | None,
            now: datetime) -> None:
    """Bring status.cost up to `now`; `running_pods`: the pods running from now on (0 once the job ended)."""
    cost = status.cost or Cost()
    if running_pods == 0 and cost.accounted_at is None and cost.gpu_seconds == 0:
        return  # nothing ran yet: no cost to show
    if cost.accounted_at is not None:
        since = (now - datetime.fromisoformat(cost.accounted_at)).total_seconds()
        cost.gpu_seconds = round(cost.gpu_seconds + cost.running_gpus * max(0.0, since), 1)
    cost.running_gpus = running_pods * devices_per_pod(job)
    cost.accounted_at = now.isoformat(timespec="seconds")
    progress = status.progress
    rendered = progress.completed - progress.kept
    cost.gpu_seconds_per_item = round(cost.gpu_seconds / rendered, 2) if rendered > 0 and cost.gpu_seconds else None
    cost.price_per_gpu_hour = per_hour
    cost.cost_so_far = cost.estimated_cost_to_finish = None
    if per_hour is not None:
        cost.cost_so_far = round(cost.gpu_seconds / 3600 * per_hour, 4)
        left = max(0, progress.total - progress.completed - progress.failed)
        if cost.gpu_seconds_per_item is not None:
            cost.estimated_cost_to_finish = round(left * cost.gpu_seconds_per_item / 3600 * per_hour, 4)
    status.cost = cost
