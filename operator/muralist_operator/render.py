"""DiffusionJob -> the Kubernetes objects that run it. Pure functions: spec in, dicts out.

Nothing here talks to the API server. The operator calls `render_children` and applies the
result; `muralist render` prints it. Owner references are added by the operator (kopf.adopt).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from muralist_api import contract
from muralist_api.contract import (
    CLAIMS_PORT,
    COMPLETION_INDEX_ANNOTATION,
    HF_HOME,
    INDEX_FAILURE_COUNT_ANNOTATION,
    MASTER_PORT,
    OUTPUT_MOUNT,
    PERMANENT_FAILURE_EXIT_CODE,
    PROGRESS_AUDIENCE,
    PROGRESS_CA_KEY,
    PROGRESS_TOKEN_DIR,
    PROGRESS_TOKEN_FILE,
    PROGRESS_TOKEN_SECONDS,
    PROMPTS_DIR,
    PROMPTS_FILE,
    SPEC_DIR,
    SPEC_FILE,
    SPEC_KEY,
    STORAGE_CREDENTIALS_DIR,
)
from muralist_api.job import DiffusionJob
from muralist_api.rules.catalog import CONFIGMAP_MAX_BYTES, TINY_MODEL_NAMES, model_size_gib
from muralist_api.runtime_spec import RuntimeSpec
from muralist_api.storage import join_uri

from .grace import termination_grace_seconds

LABEL_JOB = "muralist.dev/job-name"
LABEL_COMPONENT = "app.kubernetes.io/component"
KUEUE_LABEL_PREFIX = "kueue.x-k8s.io/"
KUEUE_QUEUE_LABEL = KUEUE_LABEL_PREFIX + "queue-name"
BASE_LABELS = {"app.kubernetes.io/name": "muralist", "app.kubernetes.io/managed-by": "muralist-operator"}

CONTAINER_NAME = "runtime"
RUNTIME_UID = 1000

GPU_RESOURCE = "nvidia.com/gpu"
# Loading briefly needs more than the weights (a state dict and the module side by side).
MEMORY_HEADROOM = 1.25
PROCESS_OVERHEAD_GIB = 2


class RenderError(ValueError):
    """A valid-looking job that cannot be turned into Kubernetes objects; says how to fix it."""


# Where the pods post progress unless the operator is told otherwise: the chart's progress
# Service in the chart's default namespace.
DEFAULT_PROGRESS_URL = "https://muralist-progress.muralist-system.svc:8443"
PROGRESS_TOKEN_VOLUME = "progress-token"
STORAGE_CREDENTIALS_VOLUME = "storage-credentials"
# Kubernetes adds this pod condition when it evicts or preempts a pod (not the pod's fault).
DISRUPTION_TARGET = "DisruptionTarget"


@dataclass(frozen=True)
class OperatorSettings:
    runtime_image: str = "ghcr.io/muralist/runtime:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    shm_size: str = "8Gi"
    master_port: int = MASTER_PORT
    claims_port: int = CLAIMS_PORT
    # The operator's progress endpoint (contract.progress_url adds the job's path); None: the
    # pods get no progress endpoint and status counts come from their termination messages.
    progress_url: str | None = DEFAULT_PROGRESS_URL
    # The PEM of the CA that signed the endpoint's certificate, handed to the pods in their spec
    # ConfigMap; None: the pods trust their image's CA bundle (a publicly issued certificate).
    progress_ca: str | None = None
    # A NetworkPolicy per job (render_network_policy) unless the job says otherwise.
    network_policies: bool = True


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


def _meta(job: DiffusionJob, name: str, namespace: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**job_labels(job), LABEL_COMPONENT: component},
    }


def _ports(settings: OperatorSettings) -> list[tuple[str, int]]:
    """The rendezvous of a world that spans pods, and the work-claim store the first pod hosts."""
    return [("rendezvous", settings.master_port), ("claims", settings.claims_port)]


def render_service(job: DiffusionJob, namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    """Headless Service: gives pod `<job>-<i>` the DNS name `<job>-<i>.<job>`, for the work-claim
    store on pod 0 and the rendezvous of worlds that span pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, job.metadata.name, namespace, "rendezvous"),
        "spec": {
            "clusterIP": "None",
            # Rank 0 must be resolvable before it is Ready: torchrun waits for the others first.
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: job.metadata.name},
            "ports": [
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                for name, port in _ports(settings)
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
        "metadata": _meta(job, job.metadata.name, namespace, "network-policy"),
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
    )


def render_spec_config_map(job: DiffusionJob, namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    """The resolved runtime spec, and the CA the pods check the progress endpoint with (both
    mounted at SPEC_DIR)."""
    payload = runtime_spec(job, namespace).model_dump_json(by_alias=True, exclude_none=True)
    if len(payload.encode()) > CONFIGMAP_MAX_BYTES:
        raise RenderError(
            f"spec.prompts: {len(job.spec.prompts)} prompts make a {len(payload.encode()) // 1024} KiB "
            f"runtime spec, over the ConfigMap limit of {CONFIGMAP_MAX_BYTES // 1024} KiB; put them "
            "in a ConfigMap or a file and use spec.promptsFrom.configMapKeyRef"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, spec_config_map_name(job.metadata.name), namespace, "spec"),
        "data": {SPEC_KEY: payload, **({PROGRESS_CA_KEY: settings.progress_ca} if _ca(settings) else {})},
    }


def _ca(settings: OperatorSettings) -> bool:
    return settings.progress_url is not None and bool(settings.progress_ca)


def launcher_command(job: DiffusionJob) -> list[str]:
    """The container command: the pod contract's launch entry point, which starts torchrun or
    accelerate launch for this pod's world (and exits 78 on a permanent failure)."""
    return contract.pod_command(SPEC_FILE)


def _field(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def _annotation(name: str) -> dict[str, Any]:
    return _field(f"metadata.annotations['{name}']")


def _torchrun_env(job: DiffusionJob, settings: OperatorSettings) -> list[dict[str, Any]]:
    """A pod whose groups fit in it is a world of its own: its whole torchrun configuration is
    static. A world that spans pods gets its size and port here; its node rank and master
    depend on the pod's index, and the launch entry point computes them from MURALIST_POD_INDEX."""
    par = job.spec.parallelism
    ppn = par.resolved_processes_per_node
    world, rdzv = contract.pod_world(job.metadata.name, 0, ppn, par.gpus_per_node, par.group_size,
                                     port=settings.master_port)
    pet = contract.torchrun_env(world, rdzv)
    if world.nodes > 1:
        pet = {k: v for k, v in pet.items() if k not in (contract.PET_NODE_RANK, contract.PET_MASTER_ADDR)}
    return [{"name": k, "value": v} for k, v in pet.items()]


def _env(job: DiffusionJob, namespace: str, settings: OperatorSettings) -> list[dict[str, Any]]:
    name = job.metadata.name
    env = _torchrun_env(job, settings)
    env += [
        {"name": contract.MURALIST_POD_INDEX, "valueFrom": _annotation(COMPLETION_INDEX_ANNOTATION)},
        {"name": contract.MURALIST_POD_NAME, "valueFrom": _field("metadata.name")},
        # The Job controller counts each index's failures (backoffLimitPerIndex): this pod's retry.
        {"name": contract.MURALIST_ATTEMPT, "valueFrom": _annotation(INDEX_FAILURE_COUNT_ANNOTATION)},
        {"name": contract.MURALIST_NAMESPACE, "valueFrom": _field("metadata.namespace")},
        {"name": contract.MURALIST_CLAIMS_ADDR, "value": f"{claims_host(job)}:{settings.claims_port}"},
    ]
    if settings.progress_url is not None:
        env += [
            {"name": contract.MURALIST_PROGRESS_URL,
             "value": contract.progress_url(settings.progress_url, namespace, name)},
            {"name": contract.MURALIST_PROGRESS_TOKEN, "value": PROGRESS_TOKEN_FILE},
        ]
        if _ca(settings):
            env.append({"name": contract.MURALIST_PROGRESS_CA, "value": f"{SPEC_DIR}/{PROGRESS_CA_KEY}"})
    env += [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": HF_HOME},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    token = job.spec.model.token_secret
    if token is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}})
    if job.spec.model.name in TINY_MODEL_NAMES:
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    env.extend(var.wire() for var in job.spec.pod_template.env)
    return env


def _credentials_secrets(job: DiffusionJob) -> list[str]:
    """The Secret the job's URIs name (one per job, a CEL rule says so); none: the pods' own
    identity (IRSA, workload identity)."""
    return sorted({s.credentials_secret for s in (job.spec.dataset, job.spec.inputs, job.spec.output)
                   if s is not None and s.uri is not None and s.credentials_secret is not None})


def _env_from(job: DiffusionJob) -> list[dict[str, Any]]:
    """The storage credentials as environment: every key of the Secret becomes a variable
    (AWS_ACCESS_KEY_ID, ...: what the protocol's client reads)."""
    return [{"secretRef": {"name": name}} for name in _credentials_secrets(job)]


def _volumes(job: DiffusionJob, settings: OperatorSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    name = job.metadata.name
    output = job.spec.output
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": spec_config_map_name(name)}},
        *([] if output.uri else [{"name": "output", **(output.volume or {"emptyDir": {}})}]),
        # NCCL and torch's shared-memory tensors need far more than the default 64 MiB.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "hf-cache", **(job.spec.model.cache or {"emptyDir": {}})},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
        *([] if output.uri else [{"name": "output", "mountPath": OUTPUT_MOUNT}]),
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "hf-cache", "mountPath": HF_HOME},
    ]
    if settings.progress_url is not None:
        # The pods' only credential: a short-lived token for the operator's progress endpoint,
        # useless against the API server (its audience is not the API server's); the kubelet
        # rotates it. No API token is mounted (automountServiceAccountToken: false).
        source = {"audience": PROGRESS_AUDIENCE, "expirationSeconds": PROGRESS_TOKEN_SECONDS,
                  "path": PROGRESS_TOKEN_FILE.removeprefix(PROGRESS_TOKEN_DIR + "/")}
        volumes.append({"name": PROGRESS_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": source}]}})
        mounts.append({"name": PROGRESS_TOKEN_VOLUME, "mountPath": PROGRESS_TOKEN_DIR, "readOnly": True})
    prompts_from = job.spec.prompts_from
    if prompts_from is not None:
        ref = prompts_from.config_map_key_ref
        volumes.append(
            {"name": "prompts", "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": PROMPTS_FILE}]}}
        )
        mounts.append({"name": "prompts", "mountPath": PROMPTS_DIR, "readOnly": True})
    for secret in _credentials_secrets(job):
        # The same Secret as files, for clients that read a credentials file (a GCS key).
        volumes.append({"name": STORAGE_CREDENTIALS_VOLUME, "secret": {"secretName": secret}})
        mounts.append({"name": STORAGE_CREDENTIALS_VOLUME, "mountPath": STORAGE_CREDENTIALS_DIR, "readOnly": True})
    for volume, mount, read_from in (("dataset", contract.DATASET_MOUNT, job.spec.dataset),
                                     ("inputs", contract.INPUTS_MOUNT, job.spec.inputs)):
        if read_from is not None and read_from.volume is not None:  # a uri is read, never mounted
            volumes.append({"name": volume, **read_from.volume})
            mounts.append({"name": volume, "mountPath": mount, "readOnly": True})
    return volumes, mounts


def memory_request(job: DiffusionJob) -> str | None:
    """Host memory for one pod: every process holds the whole pipeline while it loads."""
    size = model_size_gib(job.spec.model.name, job.spec.model.dtype)
    if size is None:
        return None
    processes = job.spec.parallelism.resolved_processes_per_node
    return f"{math.ceil(processes * size * MEMORY_HEADROOM + PROCESS_OVERHEAD_GIB * processes)}Gi"


def _resources(job: DiffusionJob) -> dict[str, Any]:
    resources: dict[str, Any] = json.loads(json.dumps(job.spec.resources))  # deep copy, JSON-only values
    gpus = job.spec.parallelism.gpus_per_node
    if gpus > 0:
        limits = resources.setdefault("limits", {})
        limits.setdefault(GPU_RESOURCE, str(gpus))  # a quantity: the API client wants a string
    memory = memory_request(job)
    user_set = "memory" in resources.get("requests", {}) or "memory" in resources.get("limits", {})
    if memory and not user_set:
        resources.setdefault("requests", {})["memory"] = memory
    return resources


def render_pod_template(job: DiffusionJob, namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    tpl = job.spec.pod_template
    volumes, mounts = _volumes(job, settings)
    env_from = _env_from(job)
    container = {
        "name": CONTAINER_NAME,
        "image": job.spec.image or settings.runtime_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": launcher_command(job),
        "env": _env(job, namespace, settings),
        **({"envFrom": env_from} if env_from else {}),
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in _ports(settings)],
        "resources": _resources(job),
        "volumeMounts": mounts,
        # The runtime writes a JSON summary there; on a crash the log tail stands in for it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_spec: dict[str, Any] = {
        **({"subdomain": job.metadata.name} if needs_service(job) else {}),
        "restartPolicy": "Never",
        # Told to stop (a resize, preemption, eviction), a pod finishes its item in flight first.
        "terminationGracePeriodSeconds": termination_grace_seconds(job),
        # The pods talk to no API server: the service account only signs the progress token.
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "fsGroup": RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    optional = {
        "serviceAccountName": tpl.service_account_name,
        "nodeSelector": tpl.node_selector or None,
        "tolerations": tpl.tolerations or None,
        "affinity": tpl.affinity,
        "priorityClassName": tpl.priority_class_name,
        "schedulerName": tpl.scheduler_name,
        "imagePullSecrets": tpl.image_pull_secrets or None,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    labels = {**tpl.labels, **worker_labels(job)}
    return {
        "metadata": {"labels": labels, "annotations": dict(tpl.annotations)},
        "spec": pod_spec,
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
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**_meta(job, job.metadata.name, namespace, "workers"), "labels": labels},
        "spec": spec,
    }


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
