"""DiffusionJob -> the Kubernetes objects that run it. Pure functions: spec in, dicts out.

Nothing here talks to the API server. The operator calls `render_children` and applies the
result; `muralist render` prints it. Owner references are added by the operator (kopf.adopt).
The pods' template is pod.py's; names and labels are naming.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from muralist_api import contract
from muralist_api.contract import (
    OUTPUT_MOUNT,
    PERMANENT_FAILURE_EXIT_CODE,
    PROGRESS_CA_KEY,
    PROMPTS_DIR,
    PROMPTS_FILE,
    SPEC_KEY,
)
from muralist_api.job import DiffusionJob
from muralist_api.rules.catalog import CONFIGMAP_MAX_BYTES
from muralist_api.runtime_spec import RuntimeSpec, runtime_spec_json
from muralist_api.storage import join_uri

from .naming import (
    KUEUE_ELASTIC_JOB,
    KUEUE_LABEL_PREFIX,
    KUEUE_QUEUE_LABEL,
    LABEL_COMPONENT,
    LABEL_JOB,
    job_labels,
    needs_service,
    object_meta,
    spec_config_map_name,
)
from .pod import CONTAINER_NAME, DISRUPTION_TARGET, render_pod_template
from .settings import OperatorSettings


class RenderError(ValueError):
    """A valid-looking job that cannot be turned into Kubernetes objects; says how to fix it."""


@dataclass(frozen=True)
class Children:
    """Everything one DiffusionJob owns, in the order it should be created."""

    service: dict[str, Any] | None  # None for a one-pod job: nobody to meet
    spec_config_map: dict[str, Any]
    job: dict[str, Any]
    network_policy: dict[str, Any] | None = None  # None when switched off

    def all(self) -> list[dict[str, Any]]:
        # The policy first: no pod of the job is ever up without it.
        return [o for o in (self.network_policy, self.service, self.spec_config_map, self.job) if o is not None]


def child_names(job: DiffusionJob, settings: OperatorSettings) -> frozenset[tuple[str, str]]:
    """(kind, name) of what a job owns besides its Job: what the reconciler creates again when one
    is gone, known without rendering the job."""
    name = job.metadata.name
    names = {("ConfigMap", spec_config_map_name(name))}
    if needs_service(job):
        names.add(("Service", name))
    if wants_network_policy(job, settings):
        names.add(("NetworkPolicy", name))
    return frozenset(names)


def render_service(job: DiffusionJob, namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    """Headless Service: gives pod `<job>-<i>` the DNS name `<job>-<i>.<job>`, for the work-claim
    store on pod 0 and the rendezvous of worlds that span pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(job, job.metadata.name, namespace, "rendezvous"),
        "spec": {
            "clusterIP": "None",
            # Rank 0 must be resolvable before it is Ready: torchrun waits for the others first.
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: job.metadata.name},
            "ports": [
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                for name, port in settings.ports()
            ],
        },
    }


def wants_network_policy(job: DiffusionJob, settings: OperatorSettings) -> bool:
    asked = job.spec.network_policy.enabled
    return settings.network_policies if asked is None else asked


def render_network_policy(job: DiffusionJob, namespace: str) -> dict[str, Any]:
    """Only the job's own pods may connect to its pods. What they serve each other: the work-claim
    store on the first pod (a stranger adding to its counters would make items go missing, or
    the merge start early), the rendezvous of a world that spans pods, and that world's process
    groups (gloo and NCCL connect on ports they pick at random, so no port is named: every port
    is the job's alone). Nothing else connects to a job's pods: no probes or metrics, and what
    comes from the pod's own node (kubelet) is never subject to a NetworkPolicy. Outgoing
    traffic is left alone (progress posts, model downloads, object storage)."""
    def pods() -> dict[str, Any]:  # one object per use: YAML output would show a shared one as an anchor
        return {"matchLabels": {LABEL_JOB: job.metadata.name}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(job, job.metadata.name, namespace, "network-policy"),
        "spec": {
            "podSelector": pods(),
            "policyTypes": ["Ingress"],
            # A peer with a podSelector alone is a pod of the policy's own namespace.
            "ingress": [{"from": [{"podSelector": pods()}]}],
        },
    }


def runtime_spec(job: DiffusionJob, namespace: str) -> RuntimeSpec:
    # The job's spec was validated when it was parsed: not again (50,000 prompts, every reconcile).
    dataset, inputs, output = job.spec.dataset, job.spec.inputs, job.spec.output
    return RuntimeSpec.model_construct(
        name=job.metadata.name,
        namespace=namespace,
        spec=job.spec,
        output_dir=f"{contract.OUTPUT_STAGING if output.uri else OUTPUT_MOUNT}/{job.output_path}",
        output_uri=join_uri(output.uri, job.output_path) if output.uri else None,
        prompts_file=f"{PROMPTS_DIR}/{PROMPTS_FILE}" if job.spec.prompts_from else None,
        model_path=None,
        dataset_dir=contract.DATASET_MOUNT if dataset and dataset.volume is not None else None,
        dataset_uri=join_uri(dataset.uri, dataset.path) if dataset and dataset.uri else None,
        inputs_dir=contract.INPUTS_MOUNT if inputs and inputs.volume is not None else None,
        inputs_uri=inputs.uri if inputs and inputs.uri else None,
        # strategy Auto: the plan the pods confirm (planning.apply put it into the job's status)
        parallel_plan=job.status.parallel_plan if job.status is not None else None,
    )


def render_spec_config_map(job: DiffusionJob, namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    """The resolved runtime spec, and the CA the pods check the progress endpoint with (both
    mounted at SPEC_DIR)."""
    # Only what differs from its default: an image of the release before reads it (contract/versions.py).
    payload = runtime_spec_json(runtime_spec(job, namespace))
    if len(payload.encode()) > CONFIGMAP_MAX_BYTES:
        raise RenderError(
            f"spec.prompts: {len(job.spec.prompts)} prompts make a {len(payload.encode()) // 1024} KiB "
            f"runtime spec, over the ConfigMap limit of {CONFIGMAP_MAX_BYTES // 1024} KiB; put them "
            "in a ConfigMap or a file and use spec.promptsFrom.configMapKeyRef"
        )
    ca = {PROGRESS_CA_KEY: settings.progress_ca} if settings.ships_progress_ca() else {}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(job, spec_config_map_name(job.metadata.name), namespace, "spec"),
        "data": {SPEC_KEY: payload, **ca},
    }


def pod_failure_policy() -> dict[str, Any]:
    """What the Job controller does with a failed pod before counting it against its index."""
    return {
        "rules": [
            # The runtime's verdict that retrying cannot help (the launch entry point exits 78).
            {"action": "FailJob",
             "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "In",
                             "values": [PERMANENT_FAILURE_EXIT_CODE]}},
            # Evicted or preempted: not the pod's fault, retried without counting.
            {"action": "Ignore", "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}]},
        ]
    }


def render_job(
    job: DiffusionJob,
    namespace: str,
    settings: OperatorSettings,
    *,
    active_deadline_seconds: int | None = None,
) -> dict[str, Any]:
    """The Indexed Job: one pod per node, each index its own failure domain. A failed pod is
    retried alone by the Job controller, up to runPolicy.maxRestarts times per index; an index
    out of retries, or a permanent failure (exit 78), fails the Job."""
    nodes = job.spec.parallelism.nodes
    policy = job.spec.run_policy
    # Kueue reads its labels from the Job (a WorkloadPriorityClass: kueue.x-k8s.io/priority-class):
    # the pods' own Kueue labels go on the Job too.
    kueue = {k: v for k, v in job.spec.pod_template.labels.items() if k.startswith(KUEUE_LABEL_PREFIX)}
    labels = {**kueue, **job_labels(job), LABEL_COMPONENT: "workers"}
    if policy.queue_name:
        labels[KUEUE_QUEUE_LABEL] = policy.queue_name
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        # No backoffLimit: with backoffLimitPerIndex it defaults to unlimited, the limit is per index.
        "backoffLimitPerIndex": policy.max_restarts,
        "maxFailedIndexes": 0,
        "podFailurePolicy": pod_failure_policy(),
        # Kueue admits a queued Job by unsuspending it.
        "suspend": bool(policy.suspend or policy.queue_name),
        "template": render_pod_template(job, namespace, settings),
    }
    if active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = active_deadline_seconds
    metadata = {**object_meta(job, job.metadata.name, namespace, "workers"), "labels": labels}
    if policy.workload_slices:
        metadata["annotations"] = {KUEUE_ELASTIC_JOB: "true"}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def render_children(
    job: DiffusionJob,
    namespace: str,
    settings: OperatorSettings,
    *,
    active_deadline_seconds: int | None = None,
) -> Children:
    return Children(
        service=render_service(job, namespace, settings) if needs_service(job) else None,
        spec_config_map=render_spec_config_map(job, namespace, settings),
        job=render_job(job, namespace, settings, active_deadline_seconds=active_deadline_seconds),
        network_policy=render_network_policy(job, namespace) if wants_network_policy(job, settings) else None,
    )
