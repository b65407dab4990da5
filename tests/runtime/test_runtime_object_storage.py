"""A data set in a bucket, results written back to it, under real torchrun (CPU, gloo), against a real
S3 server on loopback (tests/s3_plugin.py): Parquet rows read by range, WebDataset shards and the
index written as whole objects, a failed item, a rank killed mid-job and the resume that skips what
the bucket holds; and `muralist run` with a URI."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from muralist import results
from muralist_api import contract
from muralist_api.job import DiffusionJob
from muralist_runtime.outputs import shards

from tests.s3_plugin import S3Server

from .conftest import make_job, runtime_spec_json, torchrun

pytestmark = pytest.mark.torchrun

ROWS = [{"id": f"sku-{i}", "caption": f"a photo of thing {i}", "seed": i} for i in range(8)]
KEYS = [f"{i:05d}-000" for i in range(len(ROWS))]
NAN = {contract.MURALIST_TEST_NAN_ROWS: "0"}  # row 0's output comes out NaN: it fails alone
FAILED = "00000-000"
SHARD_ROWS = 3  # chunks (and shards) of rows 0-2, 3-5, 6-7


@pytest.fixture(scope="module")
def bucket(s3_server: S3Server) -> str:
    """A bucket holding the data set: one Parquet file of row groups of 2 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = s3_server.bucket()
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(ROWS), buf, row_group_size=2)
    s3_server.filesystem().pipe_file(f"{name}/data/rows.parquet", buf.getvalue())
    return name


def bucket_job(s3_server: S3Server, bucket: str, prefix: str, processes: int, **output: Any) -> dict[str, Any]:
    job = make_job().processes(processes).obj()
    job.pop("prompts")
    job["dataset"] = {"uri": f"s3://{bucket}/data", "path": "rows.parquet", "endpoint": s3_server.endpoint,
                      "columns": {"prompt": "caption", "seed": "seed", "id": "id"}}
    job["output"] = {"uri": f"s3://{bucket}/{prefix}", "endpoint": s3_server.endpoint, **output}
    job["runPolicy"] = {"maxFailedItems": 1}
    return job


def spec_json(job: dict[str, Any], staging: Path) -> str:
    """The RuntimeSpec the operator writes for a job in a bucket (outputs staged in `staging`)."""
    doc = json.loads(runtime_spec_json(job, staging))
    doc["outputUri"] = f"{job['output']['uri']}/t"
    doc["datasetUri"] = f"{job['dataset']['uri']}/{job['dataset']['path']}"
    return json.dumps(doc)


def objects(s3_server: S3Server, prefix: str) -> list[str]:
    fs = s3_server.filesystem()
    return sorted(p.removeprefix(prefix + "/") for p in fs.find(prefix))


def test_a_killed_rank_then_a_resume_that_skips_what_the_bucket_holds(tmp_path: Path, runtime_env, tiny_model,
                                                                      s3_server: S3Server, bucket: str) -> None:
    out = f"{bucket}/wds/t"
    env = {**s3_server.env, **NAN}
    # A one-rank pod dies right after the third image of a chunk: chunk 0 (two images, row 0 failed)
    # is finished by then, its shard uploaded; chunk 1's shard is a local temp that dies with the pod.
    job = bucket_job(s3_server, bucket, "wds", 1, layout="webdataset", shardSize=SHARD_ROWS)
    first = torchrun(spec_json(job, tmp_path / "pod-1" / "t"), tmp_path / "pod-1" / "t", runtime_env, 1,
                     extra_env={**env, contract.MURALIST_TEST_EXIT_AFTER: "3"})
    assert first.returncode != 0
    held = objects(s3_server, out)
    done = sorted(int(name[len("parts/chunk-"):-len(".jsonl")]) for name in held if name.startswith("parts/"))
    assert done == [0], held
    assert [n for n in held if n.startswith("shards/")] == [f"shards/shard-{c:06d}.tar" for c in done], (
        "a shard is in the bucket exactly when its chunk is finished")
    assert not [n for n in held if n.rsplit("/", 1)[-1].startswith(".")], "no temp object ever"
    assert "manifest.jsonl" not in held and "index.parquet" not in held
    kept = {"00001-000", "00002-000"}  # chunk 0's rendered items, in its shard

    # Retried with two ranks (the world may change on resume): a fresh staging folder, the same bucket.
    job = bucket_job(s3_server, bucket, "wds", 2, layout="webdataset", shardSize=SHARD_ROWS)
    retry = torchrun(spec_json(job, tmp_path / "pod-2" / "t"), tmp_path / "pod-2" / "t", runtime_env, 2,
                     extra_env=env)
    assert retry.returncode == 0, retry.stderr[-3000:]
    rendered_now = {e["key"] for e in retry.events("completed")}
    assert not rendered_now & kept, "what the bucket holds is not rendered again"
    assert {e["key"] for e in retry.events("skipped")} == kept, "read back from the shard in the bucket"
    assert rendered_now | kept == set(KEYS) - {FAILED}
    assert not [p for p in (tmp_path / "pod-2").rglob("*") if p.is_file() and ".tmp" in p.name], "no local temp"

    held = objects(s3_server, out)
    assert [n for n in held if n.startswith("shards/")] == [f"shards/shard-{c:06d}.tar" for c in range(3)]
    assert {"job.json", "manifest.jsonl", "index.parquet", "index.html"} <= set(held)
    assert not [n for n in held if n.rsplit("/", 1)[-1].startswith(".")], "no temp object ever"
    fs = s3_server.filesystem()
    manifest = [json.loads(line) for line in fs.cat_file(f"{out}/manifest.jsonl").decode().splitlines()]
    assert [m["key"] for m in manifest] == KEYS, "each item once, in order"
    assert [m["key"] for m in manifest if m["status"] == "failed"] == [FAILED]
    assert json.loads(fs.cat_file(f"{out}/job.json"))["items"] == {"rendered": 5, "skipped": 2, "failed": 1}
    members: dict[str, dict[str, bytes]] = {}
    for c in range(3):
        with fs.open(f"{out}/shards/shard-{c:06d}.tar", "rb") as f:
            members.update(shards.read_shard(f))
    assert sorted(members) == sorted(set(KEYS) - {FAILED}), "chunk 0's shard rewritten with its kept members"
    assert all(set(parts) == {"png", "json"} for parts in members.values())

    # What a notebook reads: the index from the bucket (the client's way), an item's image.
    options = {"client_kwargs": {"endpoint_url": s3_server.endpoint}}
    table = results.read_index(f"s3://{out}", storage_options=options)
    assert table.column("key").to_pylist() == KEYS
    assert table.column("shard").to_pylist() == [None] + [i // SHARD_ROWS for i in range(1, 8)]
    assert results.open_image(f"s3://{out}", "00007-000", options).size == (32, 32)
    manifest_job = DiffusionJob.model_validate({"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob",
                                                "metadata": {"name": "t"}, "spec": job})
    assert results.output_folder(manifest_job) == f"s3://{out}"


def test_muralist_run_writes_to_a_bucket(tmp_path: Path, runtime_env, tiny_model, s3_server: S3Server,
                                         bucket: str) -> None:
    spec = bucket_job(s3_server, bucket, "cli-run", 1)
    spec["dataset"]["start"], spec["dataset"]["end"] = 1, 3
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob",
                                        "metadata": {"name": "cli"}, "spec": spec}))
    proc = subprocess.run([sys.executable, "-m", "muralist_cli", "run", str(manifest)],
                          env={**runtime_env, **s3_server.env}, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"outputs: s3://{bucket}/cli-run/cli" in proc.stdout
    held = objects(s3_server, f"{bucket}/cli-run/cli")
    assert {"images/00001-000.png", "images/00001-000.json", "images/00002-000.png", "manifest.jsonl",
            "index.parquet", "index.html", "job.json"} <= set(held), held
    assert not [n for n in held if n.rsplit("/", 1)[-1].startswith(".")], "no temp object ever"
    assert not (tmp_path / "muralist-output").exists(), "nothing written locally"
