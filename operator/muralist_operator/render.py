"""DiffusionJob -> the Kubernetes objects that run it. Pure functions: spec in, dicts out.

Nothing here talks to the API server. The operator calls `render_children` and applies the
result; `muralist render` prints it. Owner references are added by the operator (kopf.adopt).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from muralist_runtime.spec import contract
from muralist_runtime.spec.api import DiffusionJob
from muralist_runtime.spec.catalog import CONFIGMAP_MAX_BYTES, TINY_MODEL_NAMES, model_size_gib
from muralist_runtime.spec.contract import (
    COMPLETION_INDEX_ANNOTATION,
    HF_HOME,
    MASTER_PORT,
    OUTPUT_MOUNT,
    PROMPTS_DIR,
    PROMPTS_FILE,
    SPEC_DIR,
    SPEC_KEY,
)
from muralist_runtime.spec.resolved import RuntimeSpec

LABEL_JOB = "muralist.dev/job-name"
LABEL_ATTEMPT = "muralist.dev/attempt"
LABEL_COMPONENT = "app.kubernetes.io/component"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
BASE_LABELS = {"app.kubernetes.io/name": "muralist", "app.kubernetes.io/managed-by": "muralist-operator"}

CONTAINER_NAME = "runtime"
RUNTIME_UID = 1000

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
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"} for name, port in _ports(settings)
            ],
        },
    }


def _ports(settings: OperatorSettings) -> list[tuple[str, int]]:
    """torchrun's rendezvous (a group over several pods), and the work-claim store of pod 0."""
    return [("rendezvous", settings.master_port), ("claims", contract.CLAIMS_PORT)]


def runtime_spec(job: DiffusionJob, namespace: str) -> RuntimeSpec:
    # The job's spec was validated when it was parsed: not again (50,000 prompts, every reconcile).
    return RuntimeSpec.model_construct(
        name=job.metadata.name,
        namespace=namespace,
        spec=job.spec,
        output_dir=f"{OUTPUT_MOUNT}/{job.output_path}",
        prompts_file=f"{PROMPTS_DIR}/{PROMPTS_FILE}" if job.spec.prompts_from else None,
        model_path=None,
        dataset_dir=contract.DATASET_MOUNT if job.spec.dataset else None,
        inputs_dir=contract.INPUTS_MOUNT if job.spec.inputs else None,
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


def launcher_command(job: DiffusionJob) -> list[str]:
    """The container command: the pod contract's launch entry point, which starts torchrun (or
    accelerate launch) for this pod's world."""
    return contract.pod_command()


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(job: DiffusionJob, settings: OperatorSettings, attempt: int) -> list[dict[str, Any]]:
    par = job.spec.parallelism
    name = job.metadata.name
    ppn = par.resolved_processes_per_node
    world, rdzv = contract.pod_world(name, 0, ppn, par.gpus_per_node, par.group_size, settings.master_port)
    pet = contract.torchrun_env(world, rdzv)
    if world.nodes > 1:
        # A group over several pods: its node rank and master follow from the pod's index,
        # which the launch entry point computes (a field reference cannot).
        del pet[contract.PET_NODE_RANK], pet[contract.PET_MASTER_ADDR]
    index = f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
    env: list[dict[str, Any]] = [{"name": var, "value": value} for var, value in pet.items()]
    env += [
        {"name": contract.MURALIST_POD_INDEX, **_field(index)},
        {"name": contract.MURALIST_POD_NAME, **_field("metadata.name")},
        {"name": contract.MURALIST_NAMESPACE, **_field("metadata.namespace")},
        {"name": contract.MURALIST_CLAIMS_ADDR, "value": f"{contract.master_host(name, 0)}:{contract.CLAIMS_PORT}"},
        {"name": contract.MURALIST_PROGRESS_CONFIGMAP, "value": progress_config_map_name(name)},
        {"name": contract.MURALIST_ATTEMPT, "value": str(attempt)},
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
    for volume, mount, read_from in (("dataset", contract.DATASET_MOUNT, job.spec.dataset),
                                     ("inputs", contract.INPUTS_MOUNT, job.spec.inputs)):
        if read_from is not None:
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
        "command": launcher_command(job),
        "env": _env(job, settings, attempt),
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
