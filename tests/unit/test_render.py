from __future__ import annotations

from typing import Any

import pytest
from muralist_operator.render import (
    CONFIGMAP_MAX_BYTES,
    OperatorSettings,
    RenderError,
    render_children,
)
from muralist_runtime.spec.resolved import RuntimeSpec

from tests.builders import make_job

SETTINGS = OperatorSettings(runtime_image="registry.example/muralist-runtime:test")


def env_of(job_obj: dict[str, Any]) -> dict[str, Any]:
    container = job_obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_indexed_job_carries_the_torchrun_contract() -> None:
    job = make_job("cats").world(nodes=3, gpus=4).job()
    children = render_children(job, "team-a", SETTINGS)
    spec = children.job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        3,
        3,
        0,
    )
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "cats" and pod["restartPolicy"] == "Never"
    env = env_of(children.job)
    # Each pod is its own torchrun world: pods never rendezvous with each other.
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["PET_NODE_RANK"]) == ("1", "4", "0")
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("127.0.0.1", "29500")
    assert env["MURALIST_POD_INDEX"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["MURALIST_CLAIMS_ADDR"] == "cats-0.cats:29400", "the work-claim store of the first pod"
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "muralist_runtime.launch", "--spec",
                                    "/etc/muralist/spec/spec.json"]
    assert container["image"] == SETTINGS.runtime_image
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "4"}, "requests": {"memory": "9Gi"}}


def test_headless_service_resolves_not_ready_pods() -> None:
    svc = render_children(make_job("cats").job(), "ns", SETTINGS).service
    assert svc["metadata"]["name"] == "cats"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"muralist.dev/job-name": "cats"}


def test_spec_config_map_holds_the_resolved_runtime_spec() -> None:
    job = make_job("cats").output(path="runs/one").job()
    cm = render_children(job, "ns", SETTINGS).spec_config_map
    assert cm["metadata"]["name"] == "cats-spec"
    runtime = RuntimeSpec.model_validate_json(cm["data"]["spec.json"])
    assert runtime.output_dir == "/output/runs/one"
    assert runtime.spec == job.spec and runtime.namespace == "ns"


def test_restricted_security_context_by_default() -> None:
    pod = render_children(make_job().job(), "ns", SETTINGS).job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_hf_token_only_through_a_secret_key_ref() -> None:
    job = make_job().set("spec.model.tokenSecret", {"name": "hf", "key": "token"}).job()
    children = render_children(job, "ns", SETTINGS)
    assert env_of(children.job)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    # Only the reference travels; no object carries a token value or reads the Secret.
    assert all(o["kind"] != "Secret" for o in children.all())
    hf_vars = [e for e in children.job["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "HF_TOKEN"]
    assert hf_vars == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]


def test_volumes_output_cache_shm_and_prompts() -> None:
    job = (
        make_job()
        .output(volume={"persistentVolumeClaim": {"claimName": "results"}})
        .set("spec.model.cache", {"persistentVolumeClaim": {"claimName": "hf-cache"}})
        .set("spec.promptsFrom", {"configMapKeyRef": {"name": "p", "key": "list.txt"}})
        .prompts()
        .job()
    )
    pod = render_children(job, "ns", SETTINGS).job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["output"]["persistentVolumeClaim"] == {"claimName": "results"}
    assert volumes["hf-cache"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["prompts"]["configMap"] == {"name": "p", "items": [{"key": "list.txt", "path": "prompts.txt"}]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm" and mounts["output"] == "/output"


def test_pod_template_fields_and_user_env_pass_through() -> None:
    job = (
        make_job()
        .pod_template(
            nodeSelector={"gpu": "h100"},
            tolerations=[{"key": "gpu", "operator": "Exists"}],
            priorityClassName="batch",
            schedulerName="volcano",
            labels={"team": "art"},
            annotations={"note": "x"},
            env=[{"name": "NCCL_DEBUG", "value": "INFO"}],
            serviceAccountName="renderer",
        )
        .job()
    )
    children = render_children(job, "ns", SETTINGS)
    template = children.job["spec"]["template"]
    pod = template["spec"]
    assert pod["nodeSelector"] == {"gpu": "h100"} and pod["schedulerName"] == "volcano"
    assert pod["priorityClassName"] == "batch" and pod["serviceAccountName"] == "renderer"
    assert template["metadata"]["labels"]["team"] == "art"
    assert template["metadata"]["annotations"] == {"note": "x"}
    assert env_of(children.job)["NCCL_DEBUG"] == "INFO"
    # A user's own ServiceAccount is bound to the progress Role rather than replaced.
    assert children.service_account is None
    assert children.role_binding["subjects"][0]["name"] == "renderer"


def test_runtime_role_is_least_privilege() -> None:
    children = render_children(make_job("cats").job(), "ns", SETTINGS)
    assert children.role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cats-progress"], "verbs": ["get", "patch"]}
    ]


@pytest.mark.parametrize(
    ("policy", "suspended", "queue_label"),
    [
        ({}, False, None),
        ({"suspend": True}, True, None),
        ({"queueName": "gpu-batch"}, True, "gpu-batch"),
    ],
)
def test_suspend_and_kueue(policy: dict, suspended: bool, queue_label: str | None) -> None:
    job_obj = render_children(make_job().run_policy(**policy).job(), "ns", SETTINGS).job
    assert job_obj["spec"]["suspend"] is suspended
    assert job_obj["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == queue_label


def command_of(job: Any) -> list[str]:
    return render_children(job, "ns", SETTINGS).job["spec"]["template"]["spec"]["containers"][0]["command"]


def test_a_context_parallel_group_over_two_pods_gets_a_world_of_two() -> None:
    job = make_job("cats").context_parallel(ulysses=8).world(nodes=4, gpus=4).job()
    env = env_of(render_children(job, "ns", SETTINGS).job)
    # Its node rank and master follow from the pod's index: the launch entry point computes them.
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("2", "4")
    assert "PET_NODE_RANK" not in env and "PET_MASTER_ADDR" not in env


def test_both_launchers_start_from_the_launch_entry_point() -> None:
    # The accelerate argv itself is the pod contract's, built in the pod (test_runtime_local.py).
    job = make_job().world(nodes=2, gpus=0, processes=2).set("spec.parallelism.launcher", "accelerate").job()
    assert command_of(job) == command_of(make_job().world(nodes=2, gpus=0, processes=2).job())


def test_pod_and_local_commands_come_from_one_contract() -> None:
    import sys

    from muralist_runtime import local
    from muralist_runtime.spec import contract

    job = make_job().world(nodes=2, gpus=0, processes=2).set("spec.parallelism.launcher", "accelerate").job()
    runtime = RuntimeSpec(name="cats", spec=job.spec, output_dir="/o")
    (here, _), _ = local.agent_commands(runtime, contract.SPEC_FILE, 29500, 29400)
    # The same entry point, which builds the launcher's command from the spec in both places.
    assert command_of(job)[1:] == here[1:] and here[0] == sys.executable


def test_render_refuses_a_spec_too_large_for_its_config_map() -> None:
    # Admission refuses such a job (tests/unit/test_catalog.py); render keeps its own guard for
    # a spec that did not come through admission.
    job = make_job().job()
    prompts = ["x" * 100] * (CONFIGMAP_MAX_BYTES // 100 + 10)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"prompts": prompts})})
    with pytest.raises(RenderError, match="promptsFrom"):
        render_children(job, "ns", SETTINGS)


def test_attempt_and_deadline_reach_the_job() -> None:
    job_obj = render_children(make_job().job(), "ns", SETTINGS, attempt=2, active_deadline_seconds=50).job
    assert job_obj["metadata"]["labels"]["muralist.dev/attempt"] == "2"
    assert job_obj["spec"]["activeDeadlineSeconds"] == 50
    assert env_of(job_obj)["MURALIST_ATTEMPT"] == "2"


@pytest.mark.parametrize(
    ("model", "dtype", "gpus", "strategy", "expected"),
    [
        ("black-forest-labs/FLUX.1-dev", "bfloat16", 8, "DataParallel", "336Gi"),  # 8 x (32 x 1.25 + 2)
        ("black-forest-labs/FLUX.1-dev", "bfloat16", 4, "DeviceMap", "42Gi"),  # one process
        ("stabilityai/stable-diffusion-xl-base-1.0", "float32", 1, "DataParallel", "19Gi"),
        ("my-org/unknown", "bfloat16", 8, "DataParallel", None),
    ],
)
def test_memory_request_scales_with_processes_and_model(
    model: str, dtype: str, gpus: int, strategy: str, expected: str | None
) -> None:
    builder = make_job().set("spec.model.name", model).set("spec.model.dtype", dtype).world(gpus=gpus)
    job = builder.strategy(strategy).job()
    resources = render_children(job, "ns", SETTINGS).job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources.get("requests", {}).get("memory") == expected


def test_user_memory_is_kept() -> None:
    job = (
        make_job()
        .set("spec.model.name", "black-forest-labs/FLUX.1-dev")
        .set("spec.resources", {"limits": {"memory": "100Gi"}})
        .world(gpus=8)
        .job()
    )
    resources = render_children(job, "ns", SETTINGS).job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"memory": "100Gi", "nvidia.com/gpu": "8"}}
