"""A data-set job on the real node whose rows and results are in object storage (issue 24).

Two pods read a Parquet data set from the test S3 server (moto, on the bridge's gateway where the
pods reach it) and write WebDataset shards back to it, with the credentials from a Secret (an AWS
credentials file among its keys, mounted) and `endpoint` set. The job is submitted with
`muralist submit --follow`, as a pipeline step would.
While a pod is writing a shard (its temp in the pod's /tmp emptyDir, staged before the upload),
every process of its container gets SIGKILL at once (test_chaos.py says why that kill); the Job
controller retries the pod, which resumes from what the bucket holds.

Afterwards: `submit --follow` exited 0 with the job Succeeded, every item exactly once in the
bucket's shards, no temporary object and no unfinished multipart upload, the index matches the
shards, and `muralist.Client().results()` reads that index from the bucket.

A failing job's non-zero exit from `submit --follow` is covered against the real control plane
with kwok pods (tests/cluster/test_client.py::test_submit_follow_exits_with_the_outcome): no
second real-node job for it here.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from muralist import Client
from muralist_api import contract
from PIL import Image

from tests.e2e.conftest import RealCluster
from tests.e2e.test_chaos import kill
from tests.e2e.test_diffusion_job import needs_runtime, pod_logs
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ, pod_index
from tests.s3_plugin import CREDENTIALS, S3Server

# The first test of a session also brings the node up and builds the runtime image (minutes, cold).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

SEED = 24
NAME = "from-bucket"
SECRET = "s3-keys"
# 4 shards of 4: each pod writes two, and the kill comes in a pod's second, once one is in the
# bucket for the retry to keep. Small and 2 steps: the test's budget is ~90 s on 2 busy cores.
ROWS, SHARD_SIZE = 16, 4
FOLLOW_TIMEOUT = 300
FOLLOW_ENDED = "submit --follow ended"
STAGED_SHARDS = f"muralist-output/{NAME}/shards"  # under the pod's /tmp (contract.OUTPUT_STAGING)


def put_data_set(s3: Any, bucket: str) -> None:
    """A Parquet file of ROWS captions and ids in the bucket, row groups of 4."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": f"sku-{i}", "caption": f"a ceramic mug, pattern {i}"} for i in range(ROWS)]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer, row_group_size=4)
    s3.pipe_file(f"{bucket}/data/rows.parquet", buffer.getvalue())


def bucket_job(namespace: str, bucket: str, endpoint: str) -> dict[str, Any]:
    storage = {"credentialsSecret": SECRET, "endpoint": endpoint}
    return {
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "model": {"name": "muralist/tiny-flux", "dtype": "float32"},
            "dataset": {"uri": f"s3://{bucket}/data", "path": "rows.parquet",
                        "columns": {"prompt": "caption", "id": "id"}, **storage},
            "generation": {"steps": 2, "height": 64, "width": 64, "extraArgs": {"max_sequence_length": 32}},
            "parallelism": {"strategy": "DataParallel", "nodes": 2, "gpusPerNode": 0, "processesPerNode": 1},
            "output": {"uri": f"s3://{bucket}/runs", "layout": "webdataset", "shardSize": SHARD_SIZE,
                       "format": "png", **storage},
            "runPolicy": {"maxRestarts": 1},
        },
    }


def create_secret(cluster: RealCluster, namespace: str) -> None:
    """The keys as an AWS credentials file, which the pods find through a variable of the same
    Secret: both ways the Secret reaches a pod (envFrom, and its keys as files) must work, or the
    pods have no credentials at all."""
    profile = ("[default]\n"
               f"aws_access_key_id = {CREDENTIALS['AWS_ACCESS_KEY_ID']}\n"
               f"aws_secret_access_key = {CREDENTIALS['AWS_SECRET_ACCESS_KEY']}\n")
    keys = {"credentials": profile,
            "AWS_SHARED_CREDENTIALS_FILE": f"{contract.STORAGE_CREDENTIALS_DIR}/credentials",
            "AWS_DEFAULT_REGION": CREDENTIALS["AWS_DEFAULT_REGION"]}
    cluster.kubectl("create", "secret", "generic", SECRET, "-n", namespace,
                    *(f"--from-literal={k}={v}" for k, v in keys.items()))


def submit_follow(cluster: RealCluster, namespace: str, manifest: Path) -> subprocess.Popen[str]:
    """`muralist submit JOB.yaml --follow` as a person runs it, in a process of its own."""
    argv = [sys.executable, "-m", "muralist_cli", "submit", str(manifest), "--follow",
            "--timeout", str(FOLLOW_TIMEOUT), "-n", namespace, "--kubeconfig", str(cluster.kubeconfig)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def writing_pods(cluster: RealCluster, dj: DJ) -> dict[int, Any]:
    """Running pods, by index, with a shard staged in their /tmp emptyDir now."""
    return {pod_index(p): p for p in dj.pods(NAME) if p.status.phase == "Running"
            and p.status.container_statuses and p.status.container_statuses[0].container_id
            and any((cluster.empty_dir(p.metadata.uid, "tmp") / STAGED_SHARDS).glob(".shard-*.tmp"))}


def shards_in(s3: Any, folder: str) -> list[str]:
    return sorted(s3.ls(f"{folder}/shards", detail=False)) if s3.exists(f"{folder}/shards") else []


@needs_runtime
def test_a_job_from_and_to_a_bucket_survives_a_killed_pod_and_its_results_are_read_from_the_bucket(
    real_cluster: RealCluster, real_dj: DJ, e2e_namespace: str, pod_s3_server: S3Server, tmp_path: Path
) -> None:
    s3 = pod_s3_server.filesystem()
    bucket = pod_s3_server.bucket()
    put_data_set(s3, bucket)
    create_secret(real_cluster, e2e_namespace)
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(bucket_job(e2e_namespace, bucket, pod_s3_server.endpoint)))
    folder = f"{bucket}/runs/{NAME}"
    rng = random.Random(SEED)
    started = time.monotonic()
    follower = submit_follow(real_cluster, e2e_namespace, manifest)

    def victim() -> Any:
        if follower.poll() is not None:
            return FOLLOW_ENDED
        pods = writing_pods(real_cluster, real_dj) if shards_in(s3, folder) else {}
        if not pods:
            return None
        pod = pods[rng.choice(sorted(pods))]
        return kill(real_cluster, pod) and pod

    try:
        killed = wait_for(victim, timeout=FOLLOW_TIMEOUT, interval=0.05,
                          message="a pod writing a shard once one shard is in the bucket")
        killed_at = time.monotonic() - started
        assert killed is not FOLLOW_ENDED, "submit --follow ended before the kill: make the job longer"
        out, err = follower.communicate(timeout=FOLLOW_TIMEOUT)
    finally:
        if follower.poll() is None:
            follower.kill()
    wall = time.monotonic() - started
    status = real_dj.status(NAME)
    logs = f"\nsubmit --follow:\n{out}{err[-2000:]}\n{pod_logs(real_cluster, e2e_namespace, NAME)}"
    assert follower.returncode == 0 and status.get("phase") == "Succeeded", f"{status}{logs}"
    assert f"{NAME}: Succeeded, {ROWS} images" in out and f"{NAME} Succeeded: 100%" in err, logs
    assert status["restarts"] >= 1, status
    sys.stderr.write(f"\n{NAME}: pod {pod_index(killed)} killed at {killed_at:.1f} s, Succeeded at {wall:.1f} s\n")

    # Every shard whole and every item exactly once in them.
    keys = {f"{i:05d}-000" for i in range(ROWS)}
    assert [name.rsplit("/", 1)[1] for name in shards_in(s3, folder)] == [
        f"shard-{i:06d}.tar" for i in range(ROWS // SHARD_SIZE)]
    members: dict[str, tuple[int, dict[str, bytes]]] = {}
    for path in shards_in(s3, folder):
        with tarfile.open(fileobj=io.BytesIO(s3.cat_file(path))) as tar:
            for info in tar:
                key, _, ext = info.name.partition(".")
                assert info.isfile() and ext not in members.get(key, (0, {}))[1], f"{path}: {info.name}"
                members.setdefault(key, (int(path.rsplit("-", 1)[1].split(".")[0]), {}))[1][ext] = (
                    tar.extractfile(info).read())  # type: ignore[union-attr]
    assert set(members) == keys, "every item in the shards, none twice"
    for key, (_, parts) in members.items():
        assert set(parts) == {"png", "json"}, key
        assert json.loads(parts["json"])["key"] == key
        Image.open(io.BytesIO(parts["png"])).verify()
    # No temporary object, and no multipart upload left unfinished by the kill.
    objects = s3.find(bucket)
    assert not [o for o in objects if o.rsplit("/", 1)[1].startswith(".")], objects
    uploads = s3.call_s3("list_multipart_uploads", Bucket=bucket)
    assert not uploads.get("Uploads"), uploads

    # The index, read from the bucket by the Python client with this machine's credentials and
    # the job's endpoint: every item once, each naming the shard that holds it.
    index = Client(namespace=e2e_namespace, api_client=real_cluster.api).results(NAME).to_pylist()
    assert sorted(r["key"] for r in index) == sorted(keys), "every item exactly once in the index"
    assert {r["key"]: r["shard"] for r in index} == {k: shard for k, (shard, _) in members.items()}
    assert {r["status"] for r in index} <= {"rendered", "skipped"}  # skipped: kept from the killed pod's shards
