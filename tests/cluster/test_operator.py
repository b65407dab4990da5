"""The operator against the real control plane: pods are played by kwok, their fate chosen per test."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from muralist_api.contract import INDEX_FAILURE_COUNT_ANNOTATION
from muralist_api.job import GROUP, PLURAL, VERSION

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, never_starting, set_pod_fate, wait_for
from tests.operator_helpers import DJ, pod_index
from tests.unit.api.rules.invalid_cases import INVALID_CASES

pytestmark = pytest.mark.cluster


def running_job(name: str = "cats", nodes: int = 2, **annotations: str) -> Any:
    return make_job(name).world(nodes=nodes, gpus=1).pod_template(annotations=annotations or fate_annotations("run"))


def test_creates_children_and_succeeds(dj: DJ, control_plane: Any) -> None:
    dj.create(
        make_job("cats").world(nodes=2, gpus=1).pod_template(annotations=fate_annotations("succeed", after="2s")).obj()
    )
    job = wait_for(lambda: dj.batch.read_namespaced_job("cats", dj.ns), message="Job cats")
    owner = job.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller) == ("DiffusionJob", "cats", True)
    assert (job.spec.completion_mode, job.spec.completions, job.spec.parallelism) == ("Indexed", 2, 2)
    pod_spec = job.spec.template.spec
    env = {e.name: e for e in pod_spec.containers[0].env}
    # Each pod is a world of its own; it reaches pod 0's work-claim store through the Service.
    assert env["PET_MASTER_ADDR"].value == "127.0.0.1" and env["PET_NNODES"].value == "1"
    assert env["MURALIST_CLAIMS_ADDR"].value == "cats-0.cats:29400"
    assert env["MURALIST_POD_INDEX"].value_from.field_ref.field_path.endswith("job-completion-index']")
    assert {v.name for v in pod_spec.volumes} >= {"spec", "output", "dshm", "hf-cache", "progress-token"}
    assert pod_spec.automount_service_account_token is False
    assert job.spec.backoff_limit_per_index == 3 and job.spec.max_failed_indexes == 0
    # The Job controller numbers each pod's retry, from the first pod on.
    pods = dj.wait_pods("cats", 2)
    assert [p.metadata.annotations[INDEX_FAILURE_COUNT_ANNOTATION] for p in pods] == ["0", "0"]
    # No credentials for the pods: no ServiceAccount, Role or RoleBinding of the job's own.
    assert not [a.metadata.name for a in dj.core.list_namespaced_service_account(dj.ns).items
                if a.metadata.name != "default"]
    assert not client.RbacAuthorizationV1Api(dj.core.api_client).list_namespaced_role(dj.ns).items
    svc = dj.core.read_namespaced_service("cats", dj.ns)
    assert svc.spec.cluster_ip == "None" and svc.metadata.owner_references[0].name == "cats"
    assert dj.core.read_namespaced_config_map("cats-spec", dj.ns).data["spec.json"]

    running = dj.wait_phase("cats", "Running")
    assert running["worldSize"] == 2 and running["startTime"]
    done = dj.wait_phase("cats", "Succeeded")
    assert done["completionTime"] and done["progress"]["summary"] == "2/2"
    conditions = {c["type"]: c["status"] for c in done["conditions"]}
    assert conditions["Complete"] == conditions["Ready"] == "True"
    kubectl = control_plane.bin_dir / "kubectl"
    proc = subprocess.run(
        [
            str(kubectl),
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "-n",
            dj.ns,
            "wait",
            "--for=condition=Complete",
            "dj/cats",
            "--timeout=10s",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    dj.wait_events("cats", "JobCreated", "Running", "Completed")


def test_a_failed_pod_is_retried_alone(dj: DJ) -> None:
    dj.create(running_job("cats", nodes=4).obj())
    first = {pod_index(p): p.metadata.uid for p in dj.wait_pods("cats", 4)}
    victim = dj.pods("cats", index=2)[0]
    set_pod_fate(dj.core, victim.metadata.name, dj.ns, "fail", exit_code=1, message="rank 2: NCCL timeout")

    # The failure is counted on that index only, and the job keeps running.
    retrying = wait_for(lambda: (s := dj.status("cats")).get("restarts") == 1 and s, message="one retry counted")
    assert retrying["phase"] == "Running"
    assert [(e["index"], e["failures"], e["lastFailureReason"]) for e in retrying["indexes"]] == [(2, 1, "PodFailed")]
    assert "rank 2: NCCL timeout" in retrying["indexes"][0]["lastFailure"]

    # The Job controller runs index 2 again (after its backoff); the other pods are the same pods.
    retry = wait_for(lambda: next((p for p in dj.pods("cats", index=2)
                                   if p.status.phase == "Running" and p.metadata.uid != first[2]), None),
                     timeout=60, message="a new pod for index 2")
    assert retry.metadata.annotations[INDEX_FAILURE_COUNT_ANNOTATION] == "1"
    assert {pod_index(p): p.metadata.uid for p in dj.pods("cats") if p.status.phase == "Running"} == {
        **first, 2: retry.metadata.uid}
    assert dj.status("cats")["phase"] == "Running"

    for p in dj.pods("cats"):
        if p.status.phase == "Running":
            set_pod_fate(dj.core, p.metadata.name, dj.ns, "succeed", after="100ms")
    done = dj.wait_phase("cats", "Succeeded")
    assert done["restarts"] == 1 and [e["index"] for e in done["indexes"]] == [2]
    # The first pods of indexes 0, 1 and 3 ran to the end: never replaced.
    succeeded = {pod_index(p): p.metadata.uid for p in dj.pods("cats") if p.status.phase == "Succeeded"}
    assert succeeded == {**first, 2: retry.metadata.uid}
    dj.wait_events("cats", "PodFailed")


def test_failures_beyond_max_restarts_fail(dj: DJ) -> None:
    dj.create(
        make_job("cats")
        .world(nodes=1, gpus=1)
        .run_policy(maxRestarts=1)
        .pod_template(annotations=fate_annotations("fail", exit_code=2, message="out of memory", after="200ms"))
        .obj()
    )
    failed = dj.wait_phase("cats", "Failed", timeout=90)
    assert failed["restarts"] == 1 and [(e["index"], e["failures"]) for e in failed["indexes"]] == [(0, 2)]
    assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["MaxRestartsExceeded"]
    assert "out of memory" in failed["message"]


def test_permanent_runtime_error_fails_at_once(dj: DJ) -> None:
    message = '{"permanent": true, "message": "FluxTransformer2DModel has no _tp_plan"}'
    dj.create(
        make_job("cats")
        .world(nodes=1, gpus=1)
        .pod_template(annotations=fate_annotations("fail", exit_code=1, message=message, after="200ms"))
        .obj()
    )
    failed = dj.wait_phase("cats", "Failed")
    assert failed["restarts"] == 0
    assert "no _tp_plan" in failed["message"] and "permanent" in failed["message"]


def test_exit_78_fails_the_job_by_its_pod_failure_policy(dj: DJ) -> None:
    dj.create(
        make_job("cats")
        .world(nodes=2, gpus=1)
        .pod_template(annotations=fate_annotations("fail", exit_code=78, message="spec.model: no such model",
                                                   after="200ms"))
        .obj()
    )
    failed = dj.wait_phase("cats", "Failed")
    assert failed["restarts"] == 0
    assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["PermanentError"]

    def verdict() -> str | None:
        conditions = dj.batch.read_namespaced_job("cats", dj.ns).status.conditions or []
        return next((c.reason for c in conditions if c.type == "Failed" and c.status == "True"), None)

    assert wait_for(verdict, message="the Job's own verdict") == "PodFailurePolicy"


def test_suspend_and_resume(dj: DJ) -> None:
    dj.create(running_job("cats").obj())
    dj.wait_pods("cats", 2)
    dj.patch_spec("cats", {"runPolicy": {"suspend": True}})
    dj.wait_phase("cats", "Suspended")
    wait_for(lambda: dj.batch.read_namespaced_job("cats", dj.ns).spec.suspend, message="Job suspended")
    wait_for(lambda: not dj.pods("cats"), message="pods gone while suspended")
    dj.patch_spec("cats", {"runPolicy": {"suspend": False}})
    dj.wait_phase("cats", "Running")


def test_kueue_queue_name_creates_the_job_suspended(dj: DJ) -> None:
    dj.create(make_job("cats").run_policy(queueName="gpu-batch").obj())
    job = wait_for(lambda: dj.batch.read_namespaced_job("cats", dj.ns), message="Job cats")
    assert job.spec.suspend is True and job.metadata.labels["kueue.x-k8s.io/queue-name"] == "gpu-batch"
    assert dj.wait_phase("cats", "Suspended")["message"].startswith("waiting for Kueue")


def test_deadline_fails_the_job(dj: DJ) -> None:
    dj.create(running_job("cats", nodes=1).run_policy(activeDeadlineSeconds=3).obj())
    failed = dj.wait_phase("cats", "Failed", timeout=60)
    assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["DeadlineExceeded"]


def test_deleting_the_job_collects_its_children(dj: DJ) -> None:
    dj.create(running_job("cats", nodes=1).obj())
    dj.wait_pods("cats", 1)
    dj.custom.delete_namespaced_custom_object(GROUP, VERSION, dj.ns, PLURAL, "cats")

    def gone() -> bool:
        left = [
            dj.batch.list_namespaced_job(dj.ns).items,
            dj.core.list_namespaced_service(dj.ns).items,
            [c for c in dj.core.list_namespaced_config_map(dj.ns).items if c.metadata.name.startswith("cats")],
            dj.pods("cats"),
        ]
        return not any(left)

    wait_for(gone, timeout=60, message="children garbage-collected")


def test_ttl_deletes_the_finished_job(dj: DJ) -> None:
    dj.create(
        make_job("cats")
        .run_policy(ttlSecondsAfterFinished=1)
        .pod_template(annotations=fate_annotations("succeed", after="100ms"))
        .obj()
    )

    def deleted() -> bool:
        try:
            dj.get("cats")
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(deleted, timeout=60, message="the DiffusionJob deleted after its TTL")


def test_spec_cannot_change_after_creation(dj: DJ) -> None:
    dj.create(running_job("cats", nodes=1).obj())
    with pytest.raises(ApiException) as err:
        dj.patch_spec("cats", {"generation": {"steps": 50}})
    assert err.value.status == 422 and "spec.generation cannot change" in err.value.body


def test_operator_restart_mid_reconcile_leaves_one_set_of_children(dj: DJ, operator: Any) -> None:
    operator.kill()
    try:
        for i in range(3):
            dj.create(running_job(f"job{i}", nodes=2).obj())
        operator.start()
        wait_for(lambda: dj.batch.list_namespaced_job(dj.ns).items, message="a Job created")
        operator.kill()  # while it is still creating the others' children
    finally:
        operator.start()
    for i in range(3):
        dj.wait_phase(f"job{i}", "Running")
    jobs = [j.metadata.name for j in dj.batch.list_namespaced_job(dj.ns).items]
    services = [s.metadata.name for s in dj.core.list_namespaced_service(dj.ns).items]
    assert sorted(jobs) == sorted(services) == ["job0", "job1", "job2"]
    for i in range(3):
        assert len(dj.pods(f"job{i}")) == 2


API_CASES = [(cid, m, field) for cid, m, field, by_api in INVALID_CASES if by_api]


@pytest.mark.parametrize(("manifest", "field"), [(m, f) for _, m, f in API_CASES], ids=[c[0] for c in API_CASES])
def test_api_server_refuses_what_validate_refuses(
    kube_api: Any, crd: Any, namespace: str, manifest: dict, field: str
) -> None:
    custom = client.CustomObjectsApi(kube_api)
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    assert err.value.status == 422
    assert field in err.value.body, err.value.body


def test_invalid_job_past_the_crd_becomes_failed(dj: DJ) -> None:
    # Pydantic-only rules (an empty prompt) get past the CRD: the operator reports them.
    dj.create(make_job("cats").prompts("ok", " ").obj())
    failed = dj.wait_phase("cats", "Failed")
    assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["InvalidSpec"]
    assert "spec.prompts" in failed["message"]
    dj.wait_events("cats", "InvalidSpec")


def test_a_job_too_large_for_its_spec_config_map_fails_with_the_reason(dj: DJ) -> None:
    # The API server takes the object (it is under etcd's limit), but its spec cannot reach the
    # pods through a ConfigMap: the job fails at once, says what to change, and creates nothing.
    prompts = [f"a photo of product number {i} on a white background" for i in range(22_000)]
    dj.create(make_job("huge").world(nodes=1, gpus=1).prompts(*prompts).obj())
    failed = dj.wait_phase("huge", "Failed")
    assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["InvalidSpec"]
    assert failed["message"].startswith("spec.prompts: 22000 inline prompts") and "promptsFrom" in failed["message"]
    dj.wait_events("huge", "InvalidSpec")
    with pytest.raises(ApiException) as err:
        dj.batch.read_namespaced_job("huge", dj.ns)
    assert err.value.status == 404


def test_a_job_in_object_storage_is_admitted_and_its_pods_get_the_secret_as_env(dj: DJ, control_plane: Any) -> None:
    dj.create(
        make_job("bucket").prompts()
        .set("spec.dataset", {"uri": "s3://data/captions", "path": "rows.parquet", "credentialsSecret": "s3-keys",
                              "endpoint": "http://minio.storage:9000", "columns": {"prompt": "caption"}})
        .output(uri="s3://results/runs", credentialsSecret="s3-keys", endpoint="http://minio.storage:9000",
                layout="webdataset")
        .world(nodes=1, gpus=1).pod_template(annotations=fate_annotations("run")).obj()
    )
    job = wait_for(lambda: dj.batch.read_namespaced_job("bucket", dj.ns), message="Job bucket")
    pod_spec = job.spec.template.spec
    assert [e.secret_ref.name for e in pod_spec.containers[0].env_from] == ["s3-keys"]
    assert not {"output", "dataset"} & {v.name for v in pod_spec.volumes}, "object storage is never mounted"


def test_pods_that_never_start_are_named_and_fail_the_job_at_its_start_timeout(
        dj: DJ, control_plane: Any, core_v1: Any) -> None:
    # Three pods that never start, for three reasons: an image that cannot be pulled (kwok plays
    # the kubelet's ImagePullBackOff: hack/kwok-stages.yaml), a pod no node can take (the real
    # scheduler's verdict), and a pod that Pod Security admission refuses (the Job controller
    # says so only in an Event).
    core_v1.patch_namespace(dj.ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    began = time.monotonic()
    dj.create(make_job("pull").run_policy(startTimeoutSeconds=15).pod_template(annotations=never_starting()).obj())
    dj.create(make_job("nowhere").pod_template(nodeSelector={"muralist.dev/test-pool": "none"}).obj())
    dj.create(make_job("refused").output(volume={"hostPath": {"path": "/tmp/refused"}}).obj())

    def waiting(name: str) -> dict[str, Any] | None:
        return next((c for c in dj.status(name).get("conditions") or [] if c["type"] == "PodsNotStarting"), None)

    named = {name: wait_for(lambda n=name: waiting(n), timeout=60, message=f"{name}: PodsNotStarting")
             for name in ("pull", "nowhere", "refused")}
    took = time.monotonic() - began
    assert named["pull"]["reason"] == "ImagePullBackOff"
    assert 'Back-off pulling image "muralist-runtime:test"' in named["pull"]["message"]
    assert named["nowhere"]["reason"] == "Unschedulable"
    assert "didn't match Pod's node affinity/selector" in named["nowhere"]["message"]
    assert named["refused"]["reason"] == "FailedCreate"
    assert 'violates PodSecurity "baseline:latest": hostPath volumes (volume "output")' in named["refused"]["message"]
    assert took < 60, f"named after {took:.0f}s"
    assert "Unschedulable" in dj.status("nowhere")["message"], "the phase's message says it too"

    # `kubectl get dj` shows why in its Waiting column.
    kubectl = [str(control_plane.bin_dir / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig), "-n", dj.ns]
    table = subprocess.run([*kubectl, "get", "dj"], capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert table.split()[:4] == ["NAME", "PHASE", "PROGRESS", "ETA"] and "WAITING" in table.splitlines()[0]
    assert "ImagePullBackOff" in rows["pull"] and "Unschedulable" in rows["nowhere"]
    assert "FailedCreate" in rows["refused"]

    # Past runPolicy.startTimeoutSeconds the job fails with the pod's reason, and its Job goes.
    failed = dj.wait_phase("pull", "Failed", timeout=60)
    assert [c["reason"] for c in failed["conditions"] if c["type"] == "Failed"] == ["ImagePullBackOff"]
    assert "runPolicy.startTimeoutSeconds=15" in failed["message"]
    wait_for(lambda: not dj.batch.list_namespaced_job(dj.ns, field_selector="metadata.name=pull").items,
             timeout=30, message="the Job of pull deleted")
    dj.wait_events("pull", "ImagePullBackOff")
    assert dj.status("nowhere")["phase"] == "Pending", "the default timeout (600 s) has not passed"
