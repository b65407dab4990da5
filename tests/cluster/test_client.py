"""`muralist.Client` and `muralist submit --follow` / `status` against the real control plane, with
the operator under test and kwok pods whose fates the tests choose (tests/kube_helpers.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from muralist import Client, JobFailed, WaitTimeout
from muralist import follow as following
from muralist_api.job import DiffusionJob
from muralist_api.status import DiffusionJobStatus
from muralist_cli import main

from tests.builders import make_job
from tests.cluster.test_progress_push import Poster
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for
from tests.operator_helpers import DJ, OperatorProcess
from tests.s3_plugin import S3Server
from tests.unit.client.test_results import merged_folder

pytestmark = pytest.mark.cluster


@pytest.fixture
def client(kube_api: Any, namespace: str, operator: OperatorProcess) -> Client:
    return Client(namespace=namespace, api_client=kube_api)


def test_create_follow_wait_succeeded_and_read_the_results(client: Client, dj: DJ, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Watches of a second: the job outlives several, each resumed from the last resourceVersion seen.
    monkeypatch.setattr(following, "WATCH_WINDOW_SECONDS", 1)
    # kwok's pods write nothing: the job's hostPath folder gets a folder the runtime's merge wrote.
    output = {"path": "7266f35-webdataset", "volume": {"hostPath": {"path": str(tmp_path)}}}
    job = DiffusionJob.model_validate(make_job("cats").world(nodes=1, gpus=1).set("spec.output", output)
                                      .pod_template(annotations=fate_annotations("run")).obj())
    created = client.create(job)
    assert (created.metadata.name, created.metadata.namespace) == ("cats", client.namespace)

    seen: list[DiffusionJobStatus] = []
    follower = threading.Thread(target=lambda: seen.extend(client.follow("cats", timeout=60)))
    follower.start()
    pod = dj.wait_pods("cats", 1)[0]
    assert Poster(dj, pod).post(completed=1, total=2)[0] in (200, 204)
    # Written before the pod ends, so the follower's watch is sure to carry it.
    wait_for(lambda: dj.status("cats").get("progress", {}).get("completed") == 1, message="progress 1/2 written")
    set_pod_fate(dj.core, pod.metadata.name, dj.ns, "succeed", after="1s")
    follower.join(timeout=60)

    assert not follower.is_alive() and seen[-1].phase == "Succeeded"
    assert any(s.phase == "Running" and (s.progress.completed, s.progress.total) == (1, 2) for s in seen)
    assert len({s.model_dump_json() for s in seen}) == len(seen), "each status yielded once, as it changed"

    final = client.wait("cats", timeout=10)  # finished already: the get answers, with the bar drawn once
    assert final == seen[-1] and final.progress.completed == 2
    assert "cats Succeeded" in capsys.readouterr().err
    assert [j.metadata.name for j in client.list()] == ["cats"]
    assert client.get("cats").status == final
    merged_folder(tmp_path, "7266f35-webdataset")
    assert client.results("cats").column("key").to_pylist()[:2] == ["00000-000", "00000-001"]
    assert client.open_image("cats", "00001-000").size == (16, 16)
    client.delete("cats")
    with pytest.raises(ApiException) as err:
        client.get("cats")
    assert err.value.status == 404


def test_a_failed_job_raises_job_failed_and_a_wait_can_time_out(client: Client, dj: DJ) -> None:
    client.create(make_job("doomed").world(nodes=2, gpus=1).run_policy(maxRestarts=0)
                  .pod_template(annotations=fate_annotations("fail", exit_code=2, message="out of memory",
                                                             after="300ms")).obj())
    client.create(make_job("slow").pod_template(annotations=fate_annotations("run")).obj())
    with pytest.raises(JobFailed) as err:
        client.wait("doomed", progress=False, timeout=60)
    assert "out of memory" in err.value.message and err.value.failed_indexes
    assert set(err.value.failed_indexes) <= {0, 1}
    with pytest.raises(WaitTimeout) as timeout:
        client.wait("slow", progress=False, timeout=1)
    assert isinstance(timeout.value, TimeoutError) and timeout.value.last_status.phase in ("Pending", "Running")


def test_submit_follow_exits_with_the_outcome(namespace: str, operator: OperatorProcess, control_plane: Any,
                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def manifest(name: str, builder: Any) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(builder.obj()))
        return str(path)

    ok = manifest("ok", make_job("ok").pod_template(annotations=fate_annotations("succeed", after="500ms")))
    bad = manifest("bad", make_job("bad").run_policy(maxRestarts=0).pod_template(
        annotations=fate_annotations("fail", exit_code=1, message="boom", after="300ms")))
    slow = manifest("slow", make_job("slow").pod_template(annotations=fate_annotations("run")))
    invalid = manifest("invalid", make_job("invalid").generation(steps=0))
    where = ["-n", namespace, "--kubeconfig", str(control_plane.kubeconfig)]

    assert main(["submit", ok, "--follow", "--timeout", "60", *where]) == 0
    followed = capsys.readouterr()
    assert "ok: Succeeded" in followed.out and "ok Succeeded: 100%" in followed.err
    assert main(["submit", bad, "--follow", "--quiet", *where]) == 1
    assert "DiffusionJob bad failed" in capsys.readouterr().err
    assert main(["submit", slow, "--follow", "--timeout", "1", *where]) == 124
    assert "did not finish within 1s" in capsys.readouterr().err
    assert main(["submit", invalid, *where]) == 2
    assert "spec.generation.steps" in capsys.readouterr().err

    assert main(["status", "slow", *where]) == 0
    assert capsys.readouterr().out.startswith("slow: ")
    assert main(["status", "bad", *where]) == 0
    out = capsys.readouterr().out
    assert "bad: Failed" in out and "failed indexes: 0" in out and "boom" in out
    assert main(["status", "nothing", *where]) == 2


def test_results_of_a_job_in_object_storage_are_read_from_its_bucket(client: Client, s3_server: S3Server,
                                                                     tmp_path: Path) -> None:
    # A merged folder put in the bucket where the job's output.uri says, as the runtime's pods put it.
    bucket = s3_server.bucket()
    folder = merged_folder(tmp_path, "7266f35-webdataset")
    s3_server.filesystem().put(f"{folder}/", f"{bucket}/runs/7266f35-webdataset", recursive=True)
    output = {"uri": f"s3://{bucket}/runs", "path": "7266f35-webdataset", "endpoint": s3_server.endpoint}
    client.create(make_job("in-bucket").world(nodes=1, gpus=1).set("spec.output", output)
                  .pod_template(annotations=fate_annotations("run")).obj())
    assert client.output_folder("in-bucket") == f"s3://{bucket}/runs/7266f35-webdataset"
    # The credentials are this machine's (AWS_* from s3_server), the endpoint the job's.
    assert client.results("in-bucket").column("key").to_pylist()[:2] == ["00000-000", "00000-001"]
    assert client.open_image("in-bucket", "00001-000").size == (16, 16)
    client.delete("in-bucket")
