from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from muralist_api import contract
from muralist_api.job import ContextParallelSpec
from muralist_api.rules.catalog import CONFIGMAP_MAX_BYTES
from muralist_api.rules.problems import parse_job
from muralist_api.runtime_spec import RuntimeSpec, read_runtime_spec
from muralist_operator.render import RenderError, child_names, render_children, runtime_spec
from muralist_operator.settings import OperatorSettings

from tests.builders import make_job
from tests.paths import REPO

SETTINGS = OperatorSettings(runtime_image="registry.example/muralist-runtime:test",
                            progress_url="https://progress.example.svc:8443",
                            progress_ca="-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n")


def env_of(job_obj: dict[str, Any]) -> dict[str, Any]:
    container = job_obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_indexed_job_makes_each_pod_a_failure_domain() -> None:
    job = make_job("cats").world(nodes=3, gpus=4).run_policy(maxRestarts=2).job()
    spec = render_children(job, "team-a", SETTINGS).job["spec"]
    assert {k: v for k, v in spec.items() if k != "template"} == {
        "completionMode": "Indexed",
        "completions": 3,
        "parallelism": 3,
        "backoffLimitPerIndex": 2,  # each pod retried alone, up to maxRestarts times
        "maxFailedIndexes": 0,  # an index out of retries fails the Job
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "runtime", "operator": "In", "values": [78]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]},
        "suspend": False,
    }
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "cats" and pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "muralist_runtime.launch", "--spec", "/etc/muralist/spec/spec.json"]
    assert container["image"] == SETTINGS.runtime_image
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "4"}, "requests": {"memory": "9Gi"}}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"rendezvous": 29500, "claims": 29400}


def index_annotation(name: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": f"metadata.annotations['batch.kubernetes.io/{name}']"}}


def test_a_pod_is_a_world_of_its_own_and_knows_where_to_report() -> None:
    job = make_job("cats").world(nodes=3, gpus=4).job()
    env = env_of(render_children(job, "team-a", SETTINGS).job)
    assert {k: v for k, v in env.items() if k.startswith(("PET_", "MURALIST_"))} == {
        # The whole torchrun world is inside the pod: nobody to meet, on loopback.
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "4",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29500",
        "MURALIST_POD_INDEX": index_annotation("job-completion-index"),
        "MURALIST_POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "MURALIST_ATTEMPT": index_annotation("job-index-failure-count"),
        "MURALIST_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "MURALIST_CLAIMS_ADDR": "cats-0.cats:29400",
        "MURALIST_PROGRESS_URL": "https://progress.example.svc:8443/v1/namespaces/team-a/diffusionjobs/cats/progress",
        "MURALIST_PROGRESS_TOKEN": "/var/run/secrets/muralist.dev/progress/token",
        "MURALIST_PROGRESS_CA": "/etc/muralist/spec/progress-ca.crt",
    }


def test_a_context_parallel_group_across_pods_leaves_rank_and_master_to_the_launcher() -> None:
    # Built past the admission rule that keeps groups inside a pod (the runtime side lifts it).
    job = make_job("cats").world(nodes=4, gpus=2).job()
    par = job.spec.parallelism.model_copy(update={"strategy": "ContextParallel",
                                                  "context_parallel": ContextParallelSpec(ulysses_degree=4)})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"parallelism": par})})
    env = env_of(render_children(job, "ns", SETTINGS).job)
    pet = {k: v for k, v in env.items() if k.startswith("PET_")}
    assert pet == {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_MASTER_PORT": "29500"}


def test_pods_carry_no_api_credentials_only_a_progress_token() -> None:
    children = render_children(make_job("cats").world(nodes=2).job(), "ns", SETTINGS)
    assert [o["kind"] for o in children.all()] == ["NetworkPolicy", "Service", "ConfigMap", "Job"]
    pod = children.job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["progress-token"] == {"name": "progress-token", "projected": {"sources": [{"serviceAccountToken": {
        "audience": "muralist.dev", "expirationSeconds": 600, "path": "token"}}]}}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["progress-token"] == {"name": "progress-token", "mountPath": "/var/run/secrets/muralist.dev/progress",
                                        "readOnly": True}
    # The CA the pods check the endpoint with travels in the spec ConfigMap, mounted beside the spec.
    assert children.spec_config_map["data"]["progress-ca.crt"] == SETTINGS.progress_ca


def test_without_a_progress_endpoint_pods_get_no_token() -> None:
    settings = replace(SETTINGS, progress_url=None)
    children = render_children(make_job("cats").job(), "ns", settings)
    pod = children.job["spec"]["template"]["spec"]
    assert "progress-token" not in {v["name"] for v in pod["volumes"]}
    assert not {"MURALIST_PROGRESS_URL", "MURALIST_PROGRESS_TOKEN", "MURALIST_PROGRESS_CA"} & set(env_of(children.job))
    assert set(children.spec_config_map["data"]) == {"spec.json"}


def test_headless_service_resolves_not_ready_pods() -> None:
    svc = render_children(make_job("cats").world(nodes=2).job(), "ns", SETTINGS).service
    assert svc is not None and svc["metadata"]["name"] == "cats"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"muralist.dev/job-name": "cats"}
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("rendezvous", 29500), ("claims", 29400)]


def test_a_claims_port_of_the_operators_settings_is_the_one_pods_use_and_expose() -> None:
    settings = dataclasses.replace(SETTINGS, claims_port=31400)
    children = render_children(make_job("cats").world(nodes=2).job(), "ns", settings)
    assert children.service is not None
    assert dict((p["name"], p["port"]) for p in children.service["spec"]["ports"])["claims"] == 31400
    container = children.job["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["claims"] == 31400
    assert env_of(children.job)["MURALIST_CLAIMS_ADDR"] == "cats-0.cats:31400"


def test_a_one_pod_job_can_grow_so_pods_added_later_find_the_first() -> None:
    children = render_children(make_job("cats").job(), "ns", SETTINGS)
    assert [o["kind"] for o in children.all()] == ["NetworkPolicy", "Service", "ConfigMap", "Job"]
    assert children.job["spec"]["template"]["spec"]["subdomain"] == "cats"
    assert env_of(children.job)["MURALIST_CLAIMS_ADDR"] == "cats-0.cats:29400"


@pytest.mark.parametrize(("generation", "run_policy", "grace"), [
    ({"steps": 28, "height": 1024, "width": 1024}, {}, 58),  # 2 x 14 s + 30
    ({"steps": 50, "height": 2048, "width": 2048, "batchSize": 2}, {}, 430),
    ({"steps": 4, "height": 64, "width": 64}, {}, 31),  # a tiny job: about the margin
    ({"steps": 1000, "height": 2048, "width": 2048, "batchSize": 8}, {}, 3600),  # capped
    ({"steps": 28, "height": 1024, "width": 1024}, {"terminationGracePeriodSeconds": 900}, 900),
    # An 81-frame 720p video: 40 steps of 2.2 s; with checkpoints on a stop, one step and one write of its
    # 19 MB of latents (0.9 s at 20 MiB/s) instead of the whole item.
    ({"steps": 40, "height": 720, "width": 1280, "numFrames": 81}, {}, 208),
    ({"steps": 40, "height": 720, "width": 1280, "numFrames": 81}, {"checkpoint": {"everySteps": 5}}, 37),
    ({"steps": 40, "height": 720, "width": 1280, "numFrames": 81},
     {"checkpoint": {"everySteps": 5, "onTerminate": False}}, 208),
], ids=["default", "large", "tiny", "capped", "asked", "video", "video-checkpoints", "video-checkpoints-no-stop"])
def test_a_pod_told_to_stop_has_time_for_the_item_in_flight(generation: dict[str, Any], run_policy: dict[str, Any],
                                                            grace: int) -> None:
    builder = make_job("cats").generation(**generation).run_policy(**run_policy)
    if "numFrames" in generation:
        builder.set("spec.model.name", "muralist/tiny-wan").output(format="mp4")
    pod = render_children(builder.job(), "ns", SETTINGS).job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace


def test_only_the_jobs_own_pods_may_connect_to_its_pods() -> None:
    children = render_children(make_job("cats").world(nodes=2).job(), "ns", SETTINGS)
    assert children.network_policy == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "cats", "namespace": "ns", "labels": {
            "app.kubernetes.io/name": "muralist", "app.kubernetes.io/managed-by": "muralist-operator",
            "muralist.dev/job-name": "cats", "app.kubernetes.io/component": "network-policy"}},
        "spec": {
            "podSelector": {"matchLabels": {"muralist.dev/job-name": "cats"}},
            # Ingress only, and every port: gloo and NCCL pick theirs at random.
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"muralist.dev/job-name": "cats"}}}]}],
        },
    }
    assert "&id" not in yaml.safe_dump(children.network_policy)  # `muralist render` shows no YAML anchors
    # It selects the job's pods, whatever labels the user adds to them.
    labeled = make_job("cats").world(nodes=2).pod_template(labels={"muralist.dev/job-name": "dogs"}).job()
    pod_labels = render_children(labeled, "ns", SETTINGS).job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["muralist.dev/job-name"] == "cats"


@pytest.mark.parametrize(("operator", "job", "rendered"), [
    (True, None, True), (True, True, True), (True, False, False),
    (False, None, False), (False, True, True), (False, False, False),
])
def test_the_job_says_whether_it_gets_a_network_policy_else_the_operator(
        operator: bool, job: bool | None, rendered: bool) -> None:
    built = make_job("cats")
    if job is not None:
        built.set("spec.networkPolicy.enabled", job)
    children = render_children(built.job(), "ns", replace(SETTINGS, network_policies=operator))
    assert (children.network_policy is not None) is rendered
    assert [o["kind"] for o in children.all()][-2:] == ["ConfigMap", "Job"]


def test_the_operator_setting_comes_from_its_flag() -> None:
    from muralist_cli import build_parser
    from muralist_operator.main import settings_from

    assert settings_from(build_parser().parse_args(["operator"])).network_policies is True
    assert settings_from(build_parser().parse_args(["operator", "--no-network-policies"])).network_policies is False


def test_spec_config_map_holds_the_resolved_runtime_spec() -> None:
    job = make_job("cats").output(path="runs/one").job()
    cm = render_children(job, "ns", SETTINGS).spec_config_map
    assert cm["metadata"]["name"] == "cats-spec"
    runtime = RuntimeSpec.model_validate_json(cm["data"]["spec.json"])
    assert runtime.output_dir == "/output/runs/one"
    assert runtime.spec == job.spec and runtime.namespace == "ns"


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_the_runtime_reads_each_example_whole_from_a_spec_without_its_defaults(example: Path) -> None:
    # Defaults stay out of the ConfigMap, so that an image of the release before reads it (a field it
    # does not know reaches it only when a job sets it): a field left out must read as its default.
    job = parse_job(next(d for d in yaml.safe_load_all(example.read_text()) if d.get("kind") == "DiffusionJob"))
    wire = json.loads(render_children(job, "ns", SETTINGS).spec_config_map["data"]["spec.json"])
    assert "runPolicy" not in wire["spec"] or "workloadSlices" not in wire["spec"]["runPolicy"]
    assert read_runtime_spec(json.dumps(wire)).model_dump() == runtime_spec(job, "ns").model_dump()


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


def test_kueue_labels_of_the_pods_go_on_the_job_where_kueue_reads_them() -> None:
    labels = {"kueue.x-k8s.io/priority-class": "batch-high", "team": "vision"}
    job_obj = render_children(make_job().run_policy(queueName="gpu-batch").pod_template(labels=labels).job(), "ns",
                              SETTINGS).job
    on_job = job_obj["metadata"]["labels"]
    assert on_job["kueue.x-k8s.io/priority-class"] == "batch-high" and "team" not in on_job
    assert on_job["kueue.x-k8s.io/queue-name"] == "gpu-batch"
    assert job_obj["spec"]["template"]["metadata"]["labels"]["team"] == "vision"


def test_workload_slices_opt_the_job_in_and_gate_its_pods_until_kueue_admits_them() -> None:
    sliced = render_children(make_job().run_policy(queueName="gpu-batch", workloadSlices=True).job(), "ns",
                             SETTINGS).job
    assert sliced["metadata"]["annotations"] == {"kueue.x-k8s.io/elastic-job": "true"}
    assert sliced["spec"]["template"]["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/elastic-job"}]
    plain = render_children(make_job().run_policy(queueName="gpu-batch").job(), "ns", SETTINGS).job
    assert "annotations" not in plain["metadata"] and "schedulingGates" not in plain["spec"]["template"]["spec"]


def pod_env(job_obj: dict[str, Any], index: int, failures: int = 0) -> dict[str, str]:
    """What the kubelet gives pod `index`: plain values, field references resolved."""
    resolved = {"metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
                "metadata.annotations['batch.kubernetes.io/job-index-failure-count']": str(failures),
                "metadata.name": f"cats-{index}-x", "metadata.namespace": "ns"}
    return {k: v if isinstance(v, str) else resolved[v["fieldRef"]["fieldPath"]] for k, v in env_of(job_obj).items()
            if isinstance(v, str) or "fieldRef" in v}


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

    from muralist_api import contract
    from muralist_runtime import local

    job = make_job().world(nodes=2, gpus=0, processes=2).set("spec.parallelism.launcher", "accelerate").job()
    runtime = RuntimeSpec(name="cats", spec=job.spec, output_dir="/o")
    (here, _), _ = local.agent_commands(runtime, contract.SPEC_FILE, 29500, 29400)
    # The same entry point, which builds the launcher's command from the spec in both places.
    assert command_of(job)[1:] == here[1:] and here[0] == sys.executable


@pytest.mark.parametrize(("processes", "multi_gpu", "cpu"), [(2, True, False), (1, False, True)])
def test_the_accelerate_launcher_runs_the_pods_own_world(tmp_path: Path, processes: int, multi_gpu: bool,
                                                         cpu: bool) -> None:
    from muralist_runtime import launch

    job = make_job("cats").world(nodes=2, gpus=0, processes=processes).set("spec.parallelism.launcher",
                                                                          "accelerate").job()
    children = render_children(job, "ns", SETTINGS)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(children.spec_config_map["data"]["spec.json"])
    argv, pet = launch.agent_command(str(spec_file), pod_env(children.job, index=1))
    assert argv[1:5] == ["-m", "muralist_runtime.agent", "accelerate.commands.launch", "--num_machines"]
    flags = dict(zip(argv[4::2], argv[5::2], strict=False))
    # Pod 1 runs a world of its own: one machine, its processes, on loopback.
    assert (flags["--num_machines"], flags["--num_processes"], flags["--machine_rank"]) == ("1", str(processes), "0")
    assert (flags["--main_process_ip"], flags["--main_process_port"]) == ("127.0.0.1", "29500")
    # accelerate refuses --cpu with --multi_gpu, and without --multi_gpu starts one process.
    assert ("--multi_gpu" in argv, "--cpu" in argv) == (multi_gpu, cpu)
    assert pet["PET_NNODES"] == "1" and pet["PET_NODE_RANK"] == "0"


def test_render_refuses_a_spec_too_large_for_its_config_map() -> None:
    # Admission refuses such a job (tests/unit/api/rules/test_catalog.py); render keeps its own guard for
    # a spec that did not come through admission.
    job = make_job().job()
    prompts = ["x" * 100] * (CONFIGMAP_MAX_BYTES // 100 + 10)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"prompts": prompts})})
    with pytest.raises(RenderError, match="promptsFrom"):
        render_children(job, "ns", SETTINGS)


def test_deadline_reaches_the_job() -> None:
    job_obj = render_children(make_job().job(), "ns", SETTINGS, active_deadline_seconds=50).job
    assert job_obj["spec"]["activeDeadlineSeconds"] == 50


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


def test_object_storage_is_read_and_written_not_mounted_with_the_secret_as_env() -> None:
    job = (make_job("captions").prompts()
           .set("spec.dataset", {"uri": "s3://data/captions", "path": "rows.parquet", "credentialsSecret": "s3-keys",
                                 "endpoint": "http://minio.storage:9000"})
           .set("spec.inputs", {"uri": "s3://data/photos/", "credentialsSecret": "s3-keys"})
           .output(uri="s3://results/runs", path="june", credentialsSecret="s3-keys", layout="webdataset")
           .job())
    children = render_children(job, "team-a", SETTINGS)
    pod = children.job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-keys"}}], "the Secret's keys, as the client reads them"
    # ... and as files, for a client that reads a credentials file the Secret's keys point it to.
    credentials = [v for v in pod["volumes"] if v.get("secret")]
    assert credentials == [{"name": "storage-credentials", "secret": {"secretName": "s3-keys"}}]
    assert {"name": "storage-credentials", "mountPath": contract.STORAGE_CREDENTIALS_DIR,
            "readOnly": True} in container["volumeMounts"]
    assert not {"output", "dataset", "inputs"} & {v["name"] for v in pod["volumes"]}, "a uri is never mounted"
    assert "/output" not in {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, "outputs are staged in the pod's emptyDir"
    runtime = RuntimeSpec.model_validate_json(children.spec_config_map["data"]["spec.json"])
    assert (runtime.output_uri, runtime.output_dir) == ("s3://results/runs/june", "/tmp/muralist-output/june")
    assert (runtime.dataset_uri, runtime.dataset_dir) == ("s3://data/captions/rows.parquet", None)
    assert (runtime.inputs_uri, runtime.inputs_dir) == ("s3://data/photos/", None)
    assert runtime.spec.dataset is not None and runtime.spec.dataset.options() == {
        "client_kwargs": {"endpoint_url": "http://minio.storage:9000"}}, "the endpoint reaches the runtime"


def test_a_compile_cache_in_a_bucket_gets_the_jobs_secret_and_reaches_the_runtime() -> None:
    job = (make_job("compiled").generation(compile=True)
           .set("spec.model.compileCache", {"uri": "s3://models/compile", "credentialsSecret": "s3-keys",
                                            "endpoint": "http://minio.storage:9000"})
           .job())
    children = render_children(job, "team-a", SETTINGS)
    container = children.job["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-keys"}}], "its credentials, as any uri's"
    runtime = RuntimeSpec.model_validate_json(children.spec_config_map["data"]["spec.json"])
    assert runtime.spec.model.compile_cache is not None
    assert runtime.spec.model.compile_cache.options() == {"client_kwargs": {"endpoint_url": "http://minio.storage:9000"}}


def test_without_a_secret_the_pods_use_their_own_identity() -> None:
    job = make_job("cats").output(uri="gs://results").job()
    container = render_children(job, "team-a", SETTINGS).job["spec"]["template"]["spec"]["containers"][0]
    assert "envFrom" not in container, "IRSA / workload identity: nothing to inject"
    assert contract.STORAGE_CREDENTIALS_DIR not in {m["mountPath"] for m in container["volumeMounts"]}
    plain = make_job("cats").output(volume={"persistentVolumeClaim": {"claimName": "out"}}).job()
    pod = render_children(plain, "team-a", SETTINGS).job["spec"]["template"]["spec"]
    assert {"name": "output", "persistentVolumeClaim": {"claimName": "out"}} in pod["volumes"], "volumes as before"


@pytest.mark.parametrize(
    ("job", "settings"),
    [
        (make_job().job(), OperatorSettings()),  # one pod: no Service
        (make_job().world(nodes=3).job(), OperatorSettings()),
        (make_job().world(nodes=3).job(), OperatorSettings(network_policies=False)),
        (make_job().world(nodes=3).set("spec.networkPolicy", {"enabled": True}).job(),
         OperatorSettings(network_policies=False)),
    ],
    ids=["one-pod", "several", "policies-off", "job-asks"],
)
def test_child_names_are_what_render_makes_besides_the_job(job: Any, settings: OperatorSettings) -> None:
    # What the reconciler restores when one is gone, named without rendering the job.
    rendered = render_children(job, "ns", settings).all()
    assert child_names(job, settings) == {(o["kind"], o["metadata"]["name"]) for o in rendered if o["kind"] != "Job"}
