"""How the pods are scheduled and run: pod template fields, the run policy, and who may connect to
them (the job's NetworkPolicy)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from muralist_api.base import ApiModel, KubeObject, shown
from muralist_api.cel import CelRule
from muralist_api.contract import reserved_env_cel, reserved_env_problem


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
    env: Annotated[list[EnvVar], CelRule(
        reserved_env_cel(),
        "spec.podTemplate.env: PET_*, MURALIST_*, torchrun's variables and HF_TOKEN are set "
        "by Muralist; rename or remove them (use model.tokenSecret for HF_TOKEN)",
        mirrors=reserved_env_problem,
    )] = Field(
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


# Kueue's topology requests on a pod template; its elastic workload slices take neither.
KUEUE_TOPOLOGY_ANNOTATIONS = ("kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology")

# Failed items a job tolerates unless runPolicy.maxFailedItems says otherwise (RunPolicy says why).
DEFAULT_MAX_FAILED_ITEMS = "1%"
# Whatever the limit: no item completed once this many chunks, holding this many items or more,
# finished is a systematic failure (the runtime's item_failures applies the rule).
EARLY_FAILED_CHUNKS = 3
EARLY_FAILED_ITEMS = 10
# How long a pod may take to start when runPolicy.startTimeoutSeconds is unset: long enough for a
# large runtime image on an ordinary registry, short enough that no job waits forever.
DEFAULT_START_TIMEOUT_SECONDS = 600


class Checkpoint(ApiModel):
    """Checkpoints inside an item: its denoising state saved while it renders, so that a stopped or killed
    pod's item resumes where it was (docs/concepts/checkpoints.md)."""

    every_steps: int = Field(
        ge=1, le=10_000,
        description="Save the item's denoising state (its latents, the scheduler's state, the random generators' "
        "states) after every this many denoising steps, as one object next to the item's output; a killed pod "
        "then loses at most this many steps of its item. Each save writes the latents once (about 20 MB for an "
        "81-frame 720p Wan video), so save less often where steps are fast.",
    )
    on_terminate: bool = Field(
        True,
        description="Also save it when the pod is told to stop (SIGTERM: preemption, a resize, an eviction): the pod "
        "stops at the end of the step it is in, saves, and hands its chunk back, where otherwise it renders its "
        "item to the end (or loses it when the grace period ends first).",
    )


class RunPolicy(ApiModel):
    max_restarts: int = Field(
        3, ge=0, le=100,
        description="Retries of each failed pod (per index: the other pods go on); a group spanning pods "
        "retries together.",
    )
    max_failed_items: int | str = Field(
        DEFAULT_MAX_FAILED_ITEMS,
        json_schema_extra={"x-kubernetes-int-or-string": True},
        description="Items that may fail (unreadable input, NaN output, out of memory on one item) before "
        "the job fails: a count, or a percentage of all items such as '5%'. Default 1%: a job of fewer than "
        "100 items fails on its first failed item (as Ray Data does), a large one is not stopped by a few "
        "rare ones (listed in the manifest, counted in status.progress.failed, rendered again by the next "
        "run). Whatever the limit, a job fails early when its first chunks fail entirely (a systematic "
        f"failure: no item completed in the first {EARLY_FAILED_CHUNKS} chunks, {EARLY_FAILED_ITEMS} items or "
        "more), and never succeeds with every item failed; '100%' tolerates every other failure.",
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
    workload_slices: Annotated[bool, CelRule(
        "self == oldSelf",
        "spec.runPolicy.workloadSlices cannot change after creation (it is in the pods' template); create a new "
        "DiffusionJob",
        cel_only="a transition rule: Python validates a manifest, not a change to one",
    )] = Field(
        False,
        description="Resize a queued job through Kueue's elastic workload slices: the running pods go on "
        "rendering while Kueue admits the new size (a new pod waits behind a scheduling gate until then), where "
        "otherwise Kueue suspends a resized job and admits it again at its new size, every pod restarted. Needs "
        "queueName, and Kueue with its feature gate ElasticJobsViaWorkloadSlices on (alpha in v0.17: without it "
        "the pods never start); not with a required or preferred topology (Kueue refuses those). Fixed at "
        "creation.",
    )
    termination_grace_period_seconds: int | None = Field(
        None,
        ge=1,
        le=86400,
        description="How long a pod told to stop (scaled down, preempted, evicted, drained) has to finish the item "
        "it is rendering before it is killed: it stops claiming at once, writes what it finished and hands its "
        "unfinished work back to the other pods. Default: twice an estimate of one item's time from the "
        "generation settings, plus 30 s (see docs/concepts/elastic.md).",
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
    start_timeout_seconds: int | None = Field(
        None,
        ge=10,
        le=86400,
        description="Fail the job when one of its pods has not started (no container running) this long after "
        "it was created, with the reason the pod waits for: ImagePullBackOff, Unschedulable (with the "
        "scheduler's message), CreateContainerConfigError (a missing Secret or ConfigMap), FailedMount, "
        "FailedCreate (the Job could not create it: an admission rejection, a quota). Each retried pod has a clock "
        "of its own; a pod held by a scheduling gate (Kueue) and a suspended job are not timed. Default "
        f"{DEFAULT_START_TIMEOUT_SECONDS} s: raise it where pulling the image or provisioning a node takes longer. "
        "Status names a pod that waits for such a reason at once (the PodsNotStarting condition), whatever the "
        "timeout.",
    )
    checkpoint: Checkpoint | None = Field(
        None,
        description="Checkpoints inside an item (off when unset): the denoising state saved every everySteps steps "
        "and, by default, when the pod is told to stop. Whichever pod takes the item's chunk next resumes it from "
        "its last checkpoint, and the result is the uninterrupted render's, pixel for pixel. The manifest records "
        "resumedFromStep per resumed item; status.progress counts stepsSaved and stepsLost. Needs batchSize 1, no "
        "step cache, and a pipeline whose resume is verified exact (FluxPipeline, FluxImg2ImgPipeline, "
        "FluxKontextPipeline, WanPipeline, WanImageToVideoPipeline).",
    )

    @property
    def start_timeout(self) -> int:
        """startTimeoutSeconds, or its default."""
        return self.start_timeout_seconds or DEFAULT_START_TIMEOUT_SECONDS

    @field_validator("max_failed_items", mode="before")
    @classmethod
    def _null_is_default(cls, value: object) -> object:
        # As the API server does for a field with a default: null means unset.
        return DEFAULT_MAX_FAILED_ITEMS if value is None else value

    @field_validator("max_failed_items")
    @classmethod
    def _count_or_percent(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"is {value}; use a count of 0 or more, or a percentage such as '1%'")
        if isinstance(value, str) and not re.fullmatch(r"\d+(\.\d+)?%", value):
            raise ValueError(f"{shown(value)} is neither a count nor a percentage; write e.g. 10 or '1%'")
        return value

    def failed_items_limit(self, total: int) -> int:
        """How many failed items the job tolerates out of `total`."""
        value = self.max_failed_items
        if isinstance(value, int):
            return value
        return int(total * float(value.rstrip("%")) / 100)


class NetworkPolicySpec(ApiModel):
    enabled: bool | None = Field(
        None,
        description="Give the job a NetworkPolicy that lets only its own pods connect to its pods: to the "
        "work-claim store on the first pod, the rendezvous of worlds that span pods and their process groups "
        "(outgoing traffic stays open). Default: the operator's setting (on unless the Helm chart's "
        "networkPolicies.jobs is false). Enforced only where the cluster's network plugin enforces "
        "NetworkPolicies (Calico, Cilium, ...).",
    )
