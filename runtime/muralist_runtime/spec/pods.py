"""How the pods are scheduled and run: pod template fields and the run policy."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from .base import ApiModel, KubeObject
from .contract import reserved_env_problem


class EnvVar(ApiModel):
    name: str = Field(
        min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Variable name."
    )
    value: str | None = Field(None, description="Literal value.")
    value_from: KubeObject | None = Field(None, description="A Kubernetes EnvVarSource (secretKeyRef, fieldRef, ...).")


class PodTemplate(ApiModel):
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[KubeObject] = Field(default_factory=list, description="Pod tolerations.")
    affinity: KubeObject | None = Field(None, description="Pod affinity.")
    priority_class_name: str | None = Field(None, description="Pod priorityClassName.")
    scheduler_name: str | None = Field(None, description="Pod schedulerName (e.g. a gang scheduler).")
    service_account_name: str | None = Field(
        None, description="ServiceAccount for the pods; default the job's own runtime account."
    )
    image_pull_secrets: list[KubeObject] = Field(
        default_factory=list, description="Pod imagePullSecrets ([{name: ...}])."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=200,
        description="Extra container env vars; PET_*, MURALIST_* and torchrun's names are reserved.",
    )

    @field_validator("env")
    @classmethod
    def _no_contract_clash(cls, env: list[EnvVar]) -> list[EnvVar]:
        for i, var in enumerate(env):
            problem = reserved_env_problem(var.name)
            if problem:
                raise ValueError(f"env[{i}] {problem}")
        return env


class RunPolicy(ApiModel):
    max_restarts: int = Field(
        3, ge=0, le=100,
        description="Retries of each failed pod (per index: the other pods go on); a group spanning pods "
        "retries together.",
    )
    max_failed_items: int | str | None = Field(
        None,
        json_schema_extra={"x-kubernetes-int-or-string": True},
        description="Items that may fail (unreadable input, NaN output, out of memory on one item) before "
        "the job fails: a count, or a percentage of all items such as '1%'. Default: no limit (failed items "
        "are listed in the manifest and status.progress.failed).",
    )
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="Fail the job (DeadlineExceeded) after this many seconds."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the finished DiffusionJob after this many seconds."
    )
    suspend: bool = Field(False, description="Suspend: delete running pods, keep outputs.")
    queue_name: str | None = Field(
        None, description="Kueue LocalQueue; the Job is created suspended for Kueue to admit."
    )
    stall_timeout_seconds: int | None = Field(
        None,
        ge=10,
        description="Retry a pod (reason Stalled) whose ranks have stepped before but report no progress (no "
        "denoising step, no image) for this long; a pod whose ranks are done is left alone. Default: 10 times "
        "the slowest gap between two signs of progress of one pod seen in this job, and at least "
        "parallelism.collectiveTimeoutSeconds (600 s unless set), so a hung rank never holds a job forever. "
        "No value turns it off: set a larger one for steps that pause longer.",
    )

    @field_validator("max_failed_items")
    @classmethod
    def _count_or_percent(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"is {value}; use a count of 0 or more, or a percentage such as '1%'")
        if isinstance(value, str) and not re.fullmatch(r"\d+(\.\d+)?%", value):
            raise ValueError(f"{value!r} is neither a count nor a percentage; write e.g. 10 or '1%'")
        return value

    def failed_items_limit(self, total: int) -> int | None:
        """How many failed items the job tolerates out of `total`; None without a limit."""
        value = self.max_failed_items
        if value is None:
            return None
        if isinstance(value, int):
            return value
        return int(total * float(value.rstrip("%")) / 100)


