"""The DiffusionJob's status: phase, conditions, progress. Written by the operator only."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from .base import ApiModel


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class Progress(ApiModel):
    summary: str = Field("", description="completed/total, for `kubectl get dj`.")
    total: int = Field(0, description="Images the job renders in all.")
    completed: int = Field(0, description="Images on the volume (including ones kept from before a restart).")
    failed: int = Field(0, description="Images that could not be rendered.")


class Condition(ApiModel):
    type: str = Field(description="Created, Running, Restarting, Suspended, Complete, Failed or Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field("", description="CamelCase reason.")
    message: str = Field("", description="Human readable detail.")
    last_transition_time: str | None = Field(None, description="When status last changed.")
    observed_generation: int | None = Field(None, description="Generation this condition was computed for.")


class DiffusionJobStatus(ApiModel):
    phase: Phase = Field(Phase.PENDING, description="Pending | Running | Restarting | Suspended | Succeeded | Failed.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions (kstatus reads Ready).")
    observed_generation: int | None = Field(None, description="metadata.generation last reconciled.")
    world_size: int | None = Field(None, description="nodes x processesPerNode.")
    data_parallel_degree: int | None = Field(None, description="Groups rendering different images.")
    progress: Progress = Field(default_factory=Progress, description="Images done out of total.")
    restarts: int = Field(0, description="Times the pod group was recreated.")
    start_time: str | None = Field(None, description="When the first pod group started.")
    completion_time: str | None = Field(None, description="When the job finished.")
    output_path: str = Field("", description="Where the images are, inside the output volume.")
    message: str = Field("", description="Why the job is in its phase.")

