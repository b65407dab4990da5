"""DiffusionJob -> the Kubernetes objects that run it. Pure functions: spec in, dicts out.

Nothing here talks to the API server. The operator calls `render_children` and applies the
result; `muralist render` prints it. Owner references are added by the operator (kopf.adopt).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from muralist_runtime.spec import (
    TINY_MODEL_NAMES,
    DiffusionJob,
    RuntimeSpec,
    model_size_gib,
)

# The torchrun environment contract (torchrun reads PET_<FLAG> for each --flag).
ENV_NNODES = "PET_NNODES"
ENV_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
ENV_NODE_RANK = "PET_NODE_RANK"
ENV_MASTER_ADDR = "PET_MASTER_ADDR"
ENV_MASTER_PORT = "PET_MASTER_PORT"
MASTER_PORT = 29500
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

# Muralist's own pod environment, read by the runtime.
ENV_NAMESPACE = "MURALIST_NAMESPACE"
ENV_POD_NAME = "MURALIST_POD_NAME"
ENV_PROGRESS_CONFIGMAP = "MURALIST_PROGRESS_CONFIGMAP"
ENV_ATTEMPT = "MURALIST_ATTEMPT"

LABEL_JOB = "muralist.dev/job-name"
LABEL_ATTEMPT = "muralist.dev/attempt"
LABEL_COMPONENT = "app.kubernetes.io/component"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
BASE_LABELS = {"app.kubernetes.io/name": "muralist", "app.kubernetes.io/managed-by": "muralist-operator"}

CONTAINER_NAME = "runtime"
SPEC_DIR = "/etc/muralist/spec"
SPEC_KEY = "spec.json"
PROMPTS_DIR = "/etc/muralist/prompts"
PROMPTS_FILE = "prompts.txt"
OUTPUT_MOUNT = "/output"
HF_HOME = "/var/cache/huggingface"
RUNTIME_UID = 1000

# A ConfigMap holds at most 1 MiB; leave room for metadata and the rest of the spec.
CONFIGMAP_MAX_BYTES = 1_000_000
GPU_RESOURCE = "nvidia.com/gpu"
# Loading briefly needs more than the weights (a state dict and the module side by side).
MEMORY_HEADROOM = 1.25
PROCESS_OVERHEAD_GIB = 2


class RenderError(ValueError):
    """A valid-looking job that cannot be turned into Kubernetes objects; says how to fix it."""


@dataclass(frozen=True)
class OperatorSettings:
    runtime_image: str = "ghcr.io/muralist/runtime:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    shm_size: str = "8Gi"
    master_port: int = MASTER_PORT


@dataclass(frozen=True)
class Children:
    """Everything one DiffusionJob owns, in the order it should be created."""

    service: dict[str, Any]
    spec_config_map: dict[str, Any]
    progress_config_map: dict[str, Any]
    service_account: dict[str, Any] | None
    role: dict[str, Any]
    role_binding: dict[str, Any]
    job: dict[str, Any]

    def all(self) -> list[dict[str, Any]]:
        objs = [
            self.service,
            self.spec_config_map,
            self.progress_config_map,
            self.service_account,
            self.role,
            self.role_binding,
            self.job,
        ]
        return [o for o in objs if o is not None]


def spec_config_map_name(job_name: str) -> str:
    return f"{job_name}-spec"


def progress_config_map_name(job_name: str) -> str:
    return f"{job_name}-progress"


def runtime_account_name(job_name: str) -> str:
    return f"{job_name}-runtime"


def job_labels(job: DiffusionJob) -> dict[str, str]:
    return {**BASE_LABELS, LABEL_JOB: job.metadata.name}


def _meta(job: DiffusionJob, name: str, namespace: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**job_labels(job), LABEL_COMPONENT: component},
    }


def render_service(job: DiffusionJob, namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    """Headless Service: gives pod `<job>-<i>` the DNS name `<job>-<i>.<job>` for rendezvous."""
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
                {
                    "name": "rendezvous",
                    "port": settings.master_port,
                    "targetPort": settings.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def runtime_spec(job: DiffusionJob, namespace: str) -> RuntimeSpec:
    return RuntimeSpec(
        name=job.metadata.name,
        namespace=namespace,
        spec=job.spec,
        output_dir=f"{OUTPUT_MOUNT}/{job.output_path}",
        prompts_file=f"{PROMPTS_DIR}/{PROMPTS_FILE}" if job.spec.prompts_from else None,
    )


def render_spec_config_map(job: DiffusionJob, namespace: str) -> dict[str, Any]:
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
        "data": {SPEC_KEY: payload},
    }


def render_progress_config_map(job: DiffusionJob, namespace: str) -> dict[str, Any]:
    """Each rank merges `rank-<r>: {json}` into this ConfigMap; the operator sums them."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, progress_config_map_name(job.metadata.name), namespace, "progress"),
        "data": {},
    }


def render_rbac(job: DiffusionJob, namespace: str) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]]:
    """Least privilege for the pods: patch this job's progress ConfigMap, nothing else."""
    name = job.metadata.name
    account = job.spec.pod_template.service_account_name
    service_account = None
    if account is None:
        account = runtime_account_name(name)
        service_account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(job, account, namespace, "runtime"),
        }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(job, runtime_account_name(name), namespace, "runtime"),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [progress_config_map_name(name)],
                "verbs": ["get", "patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(job, runtime_account_name(name), namespace, "runtime"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": runtime_account_name(name)},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    return service_account, role, binding


def launcher_command(job: DiffusionJob, settings: OperatorSettings) -> list[str]:
    """The container command. torchrun takes all of its flags from the PET_* variables."""
    spec_file = f"{SPEC_DIR}/{SPEC_KEY}"
    par = job.spec.parallelism
    if par.launcher == "accelerate":
        cmd = [
            "accelerate",
            "launch",
            "--num_machines",
            str(par.nodes),
            "--num_processes",
            str(par.world_size),
            "--machine_rank",
            f"$({ENV_NODE_RANK})",
            "--main_process_ip",
            f"$({ENV_MASTER_ADDR})",
            "--main_process_port",
            f"$({ENV_MASTER_PORT})",
            "--rdzv_backend",
            "static",
        ]
        if par.gpus_per_node == 0:
            cmd.append("--cpu")
        if par.world_size > 1:
            # Without --multi_gpu accelerate starts a single process (even with --cpu).
            cmd.append("--multi_gpu")
        return [*cmd, "-m", "muralist_runtime", "--spec", spec_file]
    return ["torchrun", "-m", "muralist_runtime", "--spec", spec_file]


def _env(job: DiffusionJob, settings: OperatorSettings, attempt: int) -> list[dict[str, Any]]:
    par = job.spec.parallelism
    name = job.metadata.name
    env: list[dict[str, Any]] = [
        {"name": ENV_NNODES, "value": str(par.nodes)},
        {"name": ENV_NPROC_PER_NODE, "value": str(par.resolved_processes_per_node)},
        {
            "name": ENV_NODE_RANK,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}},
        },
        {"name": ENV_MASTER_ADDR, "value": f"{name}-0.{name}"},
        {"name": ENV_MASTER_PORT, "value": str(settings.master_port)},
        {"name": ENV_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": ENV_PROGRESS_CONFIGMAP, "value": progress_config_map_name(name)},
        {"name": ENV_ATTEMPT, "value": str(attempt)},
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


def _volumes(job: DiffusionJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    name = job.metadata.name
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": spec_config_map_name(name)}},
        {"name": "output", **(job.spec.output.volume or {"emptyDir": {}})},
        # NCCL and torch's shared-memory tensors need far more than the default 64 MiB.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "hf-cache", **(job.spec.model.cache or {"emptyDir": {}})},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
        {"name": "output", "mountPath": OUTPUT_MOUNT},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "hf-cache", "mountPath": HF_HOME},
    ]
    source = job.spec.prompts_from
    if source is not None:
        ref = source.config_map_key_ref
        volumes.append(
            {"name": "prompts", "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": PROMPTS_FILE}]}}
        )
        mounts.append({"name": "prompts", "mountPath": PROMPTS_DIR, "readOnly": True})
    return volumes, mounts


def memory_request(job: DiffusionJob) -> str | None:
    """Host memory for one pod: every process holds the whole pipeline while it loads."""
    size = model_size_gib(job.spec.model)
    if size is None:
        return None
    processes = job.spec.parallelism.resolved_processes_per_node
    return f"{math.ceil(processes * size * MEMORY_HEADROOM + PROCESS_OVERHEAD_GIB * processes)}Gi"


def _resources(job: DiffusionJob) -> dict[str, Any]:
    resources = json.loads(json.dumps(job.spec.resources))  # deep copy, JSON-only values
    gpus = job.spec.parallelism.gpus_per_node
    if gpus > 0:
        limits = resources.setdefault("limits", {})
        limits.setdefault(GPU_RESOURCE, str(gpus))  # a quantity: the API client wants a string
    memory = memory_request(job)
    user_set = "memory" in resources.get("requests", {}) or "memory" in resources.get("limits", {})
    if memory and not user_set:
        resources.setdefault("requests", {})["memory"] = memory
    return resources


def render_pod_template(job: DiffusionJob, namespace: str, settings: OperatorSettings, attempt: int) -> dict[str, Any]:
    tpl = job.spec.pod_template
    volumes, mounts = _volumes(job)
    container = {
        "name": CONTAINER_NAME,
        "image": job.spec.image or settings.runtime_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": launcher_command(job, settings),
        "env": _env(job, settings, attempt),
        "ports": [{"name": "rendezvous", "containerPort": settings.master_port, "protocol": "TCP"}],
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
        "subdomain": job.metadata.name,
        "restartPolicy": "Never",
        "serviceAccountName": tpl.service_account_name or runtime_account_name(job.metadata.name),
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
        "nodeSelector": tpl.node_selector or None,
        "tolerations": tpl.tolerations or None,
        "affinity": tpl.affinity,
        "priorityClassName": tpl.priority_class_name,
        "schedulerName": tpl.scheduler_name,
        "imagePullSecrets": tpl.image_pull_secrets or None,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    labels = {**tpl.labels, **job_labels(job), LABEL_ATTEMPT: str(attempt), LABEL_COMPONENT: "worker"}
    return {
        "metadata": {"labels": labels, "annotations": dict(tpl.annotations)},
        "spec": pod_spec,
    }


def render_job(
    job: DiffusionJob,
    namespace: str,
    settings: OperatorSettings,
    *,
    attempt: int = 0,
    active_deadline_seconds: int | None = None,
) -> dict[str, Any]:
    """The Indexed Job: one pod per node, all-or-nothing (a failed pod fails the group)."""
    nodes = job.spec.parallelism.nodes
    policy = job.spec.run_policy
    labels = {**job_labels(job), LABEL_ATTEMPT: str(attempt), LABEL_COMPONENT: "workers"}
    if policy.queue_name:
        labels[KUEUE_QUEUE_LABEL] = policy.queue_name
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        # Restarts are the operator's: the whole torchrun group must start again together.
        "backoffLimit": 0,
        # Kueue admits a queued Job by unsuspending it.
        "suspend": bool(policy.suspend or policy.queue_name),
        "template": render_pod_template(job, namespace, settings, attempt),
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
    attempt: int = 0,
    active_deadline_seconds: int | None = None,
) -> Children:
    service_account, role, binding = render_rbac(job, namespace)
    return Children(
        service=render_service(job, namespace, settings),
        spec_config_map=render_spec_config_map(job, namespace),
        progress_config_map=render_progress_config_map(job, namespace),
        service_account=service_account,
        role=role,
        role_binding=binding,
        job=render_job(job, namespace, settings, attempt=attempt, active_deadline_seconds=active_deadline_seconds),
    )
