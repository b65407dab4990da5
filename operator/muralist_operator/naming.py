"""How a job's objects are named and labelled, and how its pods find each other."""

from __future__ import annotations

from typing import Any

from muralist_api import contract
from muralist_api.job import DiffusionJob

LABEL_JOB = "muralist.dev/job-name"
LABEL_COMPONENT = "app.kubernetes.io/component"
KUEUE_LABEL_PREFIX = "kueue.x-k8s.io/"
KUEUE_QUEUE_LABEL = KUEUE_LABEL_PREFIX + "queue-name"
# runPolicy.workloadSlices: Kueue's opt-in annotation on the Job, and the scheduling gate its Job
# webhook would put in the pod template (the same name); Kueue lifts the gate of a pod once the
# Workload slice that counts it is admitted.
KUEUE_ELASTIC_JOB = KUEUE_LABEL_PREFIX + "elastic-job"
BASE_LABELS = {"app.kubernetes.io/name": "muralist", "app.kubernetes.io/managed-by": "muralist-operator"}


def needs_service(job: DiffusionJob) -> bool:
    """Pods find pod 0 (its work-claim store, a spanning world's master) by the Service's DNS. A
    one-pod job gets it too when it may grow (a resize adds pods that must find the first)."""
    return job.spec.parallelism.nodes > 1 or job.spec.parallelism.resizable


def claims_host(job: DiffusionJob) -> str:
    return contract.master_host(job.metadata.name, 0) if needs_service(job) else "127.0.0.1"


def spec_config_map_name(job_name: str) -> str:
    return f"{job_name}-spec"


def job_labels(job: DiffusionJob) -> dict[str, str]:
    return {**BASE_LABELS, LABEL_JOB: job.metadata.name}


def worker_labels(job: DiffusionJob) -> dict[str, str]:
    return {**job_labels(job), LABEL_COMPONENT: "worker"}


def pod_selector(job: DiffusionJob) -> str:
    """The job's pods as a label selector (status.selector: what the scale subresource reports)."""
    return ",".join(f"{k}={v}" for k, v in worker_labels(job).items())


def object_meta(job: DiffusionJob, name: str, namespace: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**job_labels(job), LABEL_COMPONENT: component},
    }
