"""Chaos on a real node: a data-set job whose pods are killed three times at random points.

Two pods render a Parquet data set (on a hostPath data volume) into WebDataset shards. Three
times, at a seeded random point, one pod that is writing a shard at that moment is killed:
every process of its container gets SIGKILL at once (containerd's `task kill --all`). That is
what the kernel's OOM killer does to a container (kubelet sets memory.oom.group), the kill a
GPU job meets most; no handler, no grace period, no atexit runs, and the pod fails (exit 137)
and is retried by the Job controller like any crashed pod. Deleting the pod with grace 0
would also SIGKILL it, but removes the pod object before its processes are gone.

Afterwards, with the job Succeeded: every item exactly once in the index and in the shards, no
partial shard (every tar reads to its end, each sample has its image and its metadata), no
temporary file left anywhere in the output folder, and the index matches the shards' members.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.e2e.conftest import RealCluster
from tests.e2e.test_diffusion_job import needs_runtime, pod_logs
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ, pod_index

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

SEED = 21
KILLS = 3
ROWS, SHARD_SIZE = 72, 3  # 24 shards: work left for three kills, and a few minutes in all
# Kills come once this many shards are finished (seeded, sorted), spread over the first 60 %.
KILL_AFTER_SHARDS = sorted(random.Random(SEED).sample(range(1, int(ROWS / SHARD_SIZE * 0.6)), KILLS))
JOB_TIMEOUT = 600


def data_set(directory: Path) -> Path:
    """A Parquet file of ROWS captions and ids, readable by the pods' user."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    rows = [{"id": f"sku-{i}", "caption": f"a ceramic mug, pattern {i}"} for i in range(ROWS)]
    pq.write_table(pa.Table.from_pylist(rows), directory / "rows.parquet", row_group_size=16)
    (directory / "rows.parquet").chmod(0o644)
    return directory


def chaos_job(namespace: str, data: Path, output: Path) -> dict[str, Any]:
    return {
        "apiVersion": "muralist.dev/v1alpha1",
        "kind": "DiffusionJob",
        "metadata": {"name": "chaos", "namespace": namespace},
        "spec": {
            "model": {"name": "muralist/tiny-flux", "dtype": "float32"},
            "dataset": {"volume": {"hostPath": {"path": str(data), "type": "Directory"}}, "path": "rows.parquet",
                        "columns": {"prompt": "caption", "id": "id"}},
            "generation": {"steps": 8, "height": 64, "width": 64, "extraArgs": {"max_sequence_length": 32}},
            "parallelism": {"strategy": "DataParallel", "nodes": 2, "gpusPerNode": 0, "processesPerNode": 1},
            "output": {"layout": "webdataset", "shardSize": SHARD_SIZE, "format": "png",
                       "volume": {"hostPath": {"path": str(output), "type": "Directory"}}},
            "runPolicy": {"maxRestarts": KILLS},
        },
    }


def temps(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob(".*") if p.name.endswith(".tmp")) if out.is_dir() else []


def writing_pods(dj: DJ, out: Path) -> dict[int, Any]:
    """Running pods, by index, that have a shard temp open now (its name carries the pod's
    host name, `<job>-<index>`)."""
    hosts = {p.name.rsplit(".", 2)[1].rsplit("-", 1)[0] for p in (out / "shards").glob(".shard-*.tmp")}
    return {pod_index(p): p for p in dj.pods("chaos") if p.status.phase == "Running"
            and f"chaos-{pod_index(p)}" in hosts and p.status.container_statuses
            and p.status.container_statuses[0].container_id}


def kill(cluster: RealCluster, pod: Any) -> bool:
    """SIGKILL to every process of the pod's container at once, as the OOM killer does; False
    when its processes had ended already."""
    container = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    return cluster.ctr("task", "kill", "--all", "--signal", "SIGKILL", container, check=False).returncode == 0


@needs_runtime
def test_a_data_set_job_killed_three_times_loses_nothing_and_leaves_no_temp(
    real_cluster: RealCluster, real_dj: DJ, e2e_namespace: str, host_volume: Path, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    real_dj.create(chaos_job(e2e_namespace, data_set(tmp_path / "data"), host_volume))
    out = host_volume / "chaos"
    killed: list[tuple[int, int]] = []  # (pod index, shards finished then)
    deadline = time.monotonic() + JOB_TIMEOUT

    def finished_shards() -> int:
        return len(list((out / "parts").glob("chunk-*.jsonl"))) if (out / "parts").is_dir() else 0

    try:
        for threshold in KILL_AFTER_SHARDS:
            def victim(threshold: int = threshold) -> Any:
                assert real_dj.status("chaos").get("phase") != "Succeeded", (
                    f"the job finished after {len(killed)} kills: make it longer")
                pods = writing_pods(real_dj, out) if finished_shards() >= threshold else {}
                if not pods:
                    return None
                pod = pods[rng.choice(sorted(pods))]
                time.sleep(rng.uniform(0, 0.5))  # a random point of its shard
                return kill(real_cluster, pod) and pod

            pod = wait_for(victim, timeout=deadline - time.monotonic(), interval=0.05,
                           message=f"a pod writing a shard once {threshold} shards are finished")
            killed.append((pod_index(pod), finished_shards()))
        status = wait_for(lambda: (s := real_dj.status("chaos")).get("phase") in ("Succeeded", "Failed") and s,
                          timeout=deadline - time.monotonic(), interval=0.5, message="the job to finish")
        assert status["phase"] == "Succeeded", status
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nkilled: {killed}\n{pod_logs(real_cluster, e2e_namespace, 'chaos')}") from None
    assert len(killed) == KILLS and status["restarts"] >= 1, (killed, status)

    # No temporary anywhere once the job has merged: the kills left some behind.
    assert temps(out) == [], f"kills {killed} left temporaries behind"
    keys = {f"{i:05d}-000" for i in range(ROWS)}
    # Every shard whole: it reads to its end, each sample has its image and its metadata.
    members: dict[str, tuple[int, dict[str, bytes]]] = {}
    shard_files = sorted((out / "shards").iterdir())
    assert [p.name for p in shard_files] == [f"shard-{i:06d}.tar" for i in range(ROWS // SHARD_SIZE)]
    for path in shard_files:
        with tarfile.open(path) as tar:
            for info in tar:
                key, _, ext = info.name.partition(".")
                assert info.isfile(), f"{path}: {info.name}"
                assert ext not in members.get(key, (0, {}))[1], f"{info.name} twice in the shards"
                data = tar.extractfile(info).read()  # type: ignore[union-attr]
                assert len(data) == info.size
                members.setdefault(key, (int(path.stem.split("-")[1]), {}))[1][ext] = data
    assert set(members) == keys, "every item in the shards, none twice"
    for key, (_, parts) in members.items():
        assert set(parts) == {"png", "json"}, key
        assert json.loads(parts["json"])["key"] == key
        Image.open(io.BytesIO(parts["png"])).verify()
    # The index and the manifest: every item exactly once, each naming the shard that holds it.
    import pyarrow.parquet as pq

    index = pq.read_table(out / "index.parquet").to_pylist()
    assert sorted(r["key"] for r in index) == sorted(keys), "every item exactly once in the index"
    assert {r["key"]: r["shard"] for r in index} == {k: shard for k, (shard, _) in members.items()}
    assert {r["status"] for r in index} <= {"rendered", "skipped"}
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert sorted(m["key"] for m in manifest) == sorted(keys)
