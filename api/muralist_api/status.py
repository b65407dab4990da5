"""The DiffusionJob's status: phase, conditions, progress with a forecast, per-index failures, strategy
Auto's plan and the cost per output. Written by the operator only."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from muralist_api.base import ApiModel
from muralist_api.contract.output_folder import JOB_FILE
from muralist_api.planner.record import ParallelPlan
from muralist_api.step_cache import CacheVerifyStatus


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    # Written by operators before per-index retries (they recreated the whole pod group);
    # kept so that their objects still parse. A retrying index leaves the job Running.
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})

# status.indexes lists at most this many indexes (the latest failures): a 1,024-pod job with a
# bad node pool must not grow its status without bound.
MAX_INDEX_ENTRIES = 32
MAX_FAILURE_MESSAGE = 300


class Progress(ApiModel):
    summary: str = Field("", description="completed/total and percent, for `kubectl get dj`.")
    total: int = Field(0, description="Images the job renders in all.")
    completed: int = Field(0, description="Images on the volume (including ones kept from before a retry). Once "
                           "the job has merged: the merged manifest's count.")
    failed: int = Field(0, description="Images that could not be rendered.")
    kept: int = Field(0, description="Of completed: images kept from before (an earlier run or attempt made them "
                      "for the same request), not rendered again.")
    rerendered: int = Field(0, description="Of completed: images rendered again in place of ones made for another "
                            "request (a corrected prompt, an edited row, a replaced input).")
    steps_saved: int | None = Field(None, description="runPolicy.checkpoint: denoising steps that resumed items did "
                                    "not render again, taken from their checkpoints (the merged manifest's count); "
                                    "unset without checkpoints.")
    steps_lost: int | None = Field(None, description="runPolicy.checkpoint: denoising steps rendered again because "
                                   "their item's pod stopped after its last checkpoint (a killed pod loses at most "
                                   "everySteps per item); unset without checkpoints.")
    percent: float | None = Field(None, description="(completed + failed) / total, in percent; unset while the "
                                  "total is unknown.")
    images_per_second: float | None = Field(None, description="Images rendered per second over the last minute, "
                                            "all pods together; unset until there is a rate.")
    estimated_seconds_remaining: int | None = Field(None, description="Images left divided by imagesPerSecond; "
                                                    "unset while there is no rate.")
    eta: str = Field("", description="estimatedSecondsRemaining for people (`kubectl get dj`), e.g. 4m10s.")


class Cost(ApiModel):
    gpu_seconds: float = Field(0, description="GPU-seconds the job's pods have held so far: each running pod's GPUs "
                               "(processes for a job without GPUs) times the time it ran.")
    gpu_seconds_per_item: float | None = Field(None, description="gpuSeconds per item rendered by this job (kept "
                                               "items left out); unset until one is.")
    price_per_gpu_hour: float | None = Field(None, description="The price the costs are counted at: the job's "
                                             "muralist.dev/price-per-gpu-hour annotation, else the operator's "
                                             "--price-per-gpu-hour; unset: no costs.")
    cost_so_far: float | None = Field(None, description="gpuSeconds / 3600 x pricePerGpuHour.")
    estimated_cost_to_finish: float | None = Field(None, description="Items left x gpuSecondsPerItem / 3600 x "
                                                   "pricePerGpuHour: what the rest of the job should cost.")
    running_gpus: int = Field(0, description="GPUs (processes without GPUs) of the pods running at accountedAt, "
                              "counted until the next accounting.")
    accounted_at: str | None = Field(None, description="When gpuSeconds was last brought up to date.")


class IndexStatus(ApiModel):
    index: int = Field(description="The pod's completion index (its share of the job).")
    failures: int = Field(0, description="Pods of this index that failed; each is retried alone while "
                          "runPolicy.maxRestarts allows.")
    last_failure_reason: str = Field("", description="CamelCase: PodFailed, Stalled, PermanentError, ...")
    last_failure: str = Field("", description="What the last failed pod of this index said (exit code, "
                              "termination message).")
    last_failure_time: str | None = Field(None, description="When that failure was seen.")


class Condition(ApiModel):
    type: str = Field(description="Created, Running, Restarting, Suspended, Complete, Failed, Ready, Stalled, "
                      "PodsNotStarting (there only while a pod waits to start, its reason what the pod waits for), or "
                      "ProgressUnreachable (True while no progress post of the job's running pods is accepted for the "
                      "stall timeout: no pod is deleted then; its message has the last error the endpoint saw).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field("", description="CamelCase reason.")
    message: str = Field("", description="Human readable detail.")
    last_transition_time: str | None = Field(None, description="When status last changed.")
    observed_generation: int | None = Field(None, description="Generation this condition was computed for.")


class DiffusionJobStatus(ApiModel):
    phase: Phase = Field(Phase.PENDING, description="Pending | Running | Suspended | Succeeded | Failed "
                         "(Restarting: written by older operators).")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions (kstatus reads Ready).")
    observed_generation: int | None = Field(None, description="metadata.generation last reconciled.")
    world_size: int | None = Field(None, description="nodes x processesPerNode.")
    nodes: int | None = Field(None, description="Pods the job runs now (its Job's parallelism); "
                              "spec.parallelism.nodes is the size asked for, which a resize moves towards.")
    selector: str = Field("", description="The label selector of the job's pods (the scale subresource's, for "
                          "`kubectl scale` and autoscalers).")
    data_parallel_degree: int | None = Field(None, description="Groups rendering different images.")
    progress: Progress = Field(default_factory=Progress, description="Images done out of total, rate and ETA.")
    restarts: int = Field(0, description="Pod retries, all indexes together (a failed pod is retried alone).")
    indexes: list[IndexStatus] = Field(default_factory=list, max_length=MAX_INDEX_ENTRIES,
                                       description="Indexes whose pods failed: how often and why (the latest "
                                       f"{MAX_INDEX_ENTRIES}).")
    start_time: str | None = Field(None, description="When the pods first started.")
    completion_time: str | None = Field(None, description="When the job finished.")
    output_path: str = Field(
        "", description="Where the images are, inside the output volume (or under spec.output.uri).")
    message: str = Field("", description="Why the job is in its phase.")
    parallel_plan: ParallelPlan | None = Field(
        None, description="What strategy Auto chose when the job was created, and why (the Planned condition says "
        "it in a line); the job's pods run that layout.")
    cost: Cost | None = Field(None, description="Cost per output: GPU-seconds per item, and at a price per "
                              "GPU-hour the cost so far and the estimate to finish.")
    cache_verify: CacheVerifyStatus | None = Field(
        None, description=f"What generation.cache.verify measured, from the pods that finished ({JOB_FILE} has every "
        "sampled item's figures); a job that failed it says why in message.")
