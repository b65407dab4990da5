"""DiffusionJob -> the template of its pods (pure): the runtime container, its environment (the
torchrun contract, the progress endpoint, credentials), its volumes and resources."""

from __future__ import annotations

import json
import math
from typing import Any

from muralist_api import contract
from muralist_api.contract import (
    COMPLETION_INDEX_ANNOTATION,
    HF_HOME,
    INDEX_FAILURE_COUNT_ANNOTATION,
    OUTPUT_MOUNT,
    PROGRESS_AUDIENCE,
    PROGRESS_CA_KEY,
    PROGRESS_TOKEN_DIR,
    PROGRESS_TOKEN_FILE,
    PROGRESS_TOKEN_SECONDS,
    PROMPTS_DIR,
    PROMPTS_FILE,
    SPEC_DIR,
    SPEC_FILE,
    STORAGE_CREDENTIALS_DIR,
)
from muralist_api.job import DiffusionJob
from muralist_api.rules.catalog import TINY_MODEL_NAMES, model_size_gib

from .grace import termination_grace_seconds
from .naming import KUEUE_ELASTIC_JOB, claims_host, needs_service, spec_config_map_name, worker_labels
from .settings import OperatorSettings

CONTAINER_NAME = "runtime"
RUNTIME_UID = 1000

GPU_RESOURCE = "nvidia.com/gpu"
# Loading briefly needs more than the weights (a state dict and the module side by side).
MEMORY_HEADROOM = 1.25
PROCESS_OVERHEAD_GIB = 2

PROGRESS_TOKEN_VOLUME = "progress-token"
STORAGE_CREDENTIALS_VOLUME = "storage-credentials"
# Kubernetes adds this pod condition when it evicts or preempts a pod (not the pod's fault).
DISRUPTION_TARGET = "DisruptionTarget"


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
        if settings.ships_progress_ca():
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
    return sorted({s.credentials_secret for s in job.spec.object_storage() if s.credentials_secret is not None})


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
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in settings.ports()],
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
        # Put here rather than left to Kueue's Job webhook, which a cluster may not run: a pod of a
        # size Kueue has not admitted yet must not start.
        "schedulingGates": [{"name": KUEUE_ELASTIC_JOB}] if job.spec.run_policy.workload_slices else None,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    labels = {**tpl.labels, **worker_labels(job)}
    return {
        "metadata": {"labels": labels, "annotations": dict(tpl.annotations)},
        "spec": pod_spec,
    }
