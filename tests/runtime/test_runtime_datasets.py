"""Dataset-scale jobs under real torchrun (CPU, gloo): rows from files, claimed work, items that
fail on their own, WebDataset shards that are never partial, and `muralist run` on a data set."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from muralist_api import contract
from muralist_runtime.outputs import shards

from .conftest import Run, make_job, runtime_spec_json, torchrun

pytestmark = pytest.mark.torchrun

ROWS = [
    {"id": "sku-0", "prompt": "a red fox", "seed": 3},
    {"id": "sku-1", "prompt": "a lighthouse in a storm"},
    {"id": "sku-2", "prompt": "a blue bird", "seed": "not a number"},  # a bad row: fails alone
    {"id": "sku-3", "prompt": "a castle on a mountain"},
    {"id": "sku-4", "prompt": ""},  # a bad row: no prompt
    {"id": "sku-5", "prompt": "a boat on the sea", "seed": 11},
    {"id": "sku-6", "prompt": "a portrait of an owl"},  # its output is made NaN (knob)
    {"id": "sku-7", "prompt": "a mural on a street wall"},
    # Valid JSON, not valid Unicode: an emoji cut in half (a lone surrogate); the tokenizer would raise.
    {"id": "sku-8", "prompt": "a red circle on a blue background \ud83d"},
    {"id": "sku-9", "prompt": "a tram at night"},  # its pipeline call raises (knob)
    {"id": "sku-10", "prompt": "a windmill\u0007 at\tdusk"},  # control characters: rendered
]
BAD = {"00002-000": "seed", "00004-000": "prompt", "00006-000": "NaN",
       "00008-000": "prompt is not valid Unicode: a lone surrogate '\\ud83d' at character 34",
       "00009-000": "InjectedFailure: MURALIST_TEST_RAISE_ROWS: the call of row 9 fails"}
# Row 6's output comes out NaN, row 9's call raises inside the pipeline, row 1's runs out of memory once.
FAULTS = {contract.MURALIST_TEST_NAN_ROWS: "6", contract.MURALIST_TEST_RAISE_ROWS: "9",
          contract.MURALIST_TEST_OOM_ROWS: "1"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return root


def dataset_job(dataset: Path, processes: int = 1, nodes: int = 1, **fields) -> dict:
    job = make_job().processes(processes, nodes=nodes).obj()
    job.pop("prompts")
    job["dataset"] = {"volume": {"hostPath": {"path": str(dataset)}}, "path": "rows.jsonl",
                      "columns": {"prompt": "prompt", "seed": "seed", "id": "id"}}
    # The bad rows are the point of these tests: more than the default 1% of 8 items tolerates.
    job["runPolicy"] = {"maxFailedItems": len(BAD)}
    job.update(fields)
    return job


def spec_json(job: dict, out: Path, dataset: Path) -> str:
    doc = json.loads(runtime_spec_json(job, out))
    doc["datasetDir"] = str(dataset)
    return json.dumps(doc)


def check_failed_and_named(run: Run) -> None:
    manifest = run.manifest()
    assert [m["key"] for m in manifest] == [f"{i:05d}-000" for i in range(len(ROWS))], "every item once, in order"
    failed = {m["key"]: m["error"] for m in manifest if m["status"] == "failed"}
    assert set(failed) == set(BAD)
    for key, word in BAD.items():
        assert word in failed[key], failed[key]
    assert {m["id"] for m in manifest} == {r["id"] for r in ROWS}
    assert [m["prompt"] for m in manifest[8:]] == [r["prompt"] for r in ROWS[8:]], "the manifest keeps the texts"
    # The index (UTF-8 by Parquet's rules) and the gallery (a UTF-8 page) show the cut emoji escaped.
    index = {r["key"]: r for r in shards.read_index(run.output / "index.parquet")}
    assert index["00008-000"]["prompt"] == "a red circle on a blue background \\ud83d"
    assert index["00010-000"]["prompt"] == "a windmill\\x07 at\tdusk"
    page = (run.output / "index.html").read_text(encoding="utf-8")
    assert "a red circle on a blue background \\ud83d" in page


def test_an_item_out_of_memory_is_tried_once_more_and_renders(one_rank: Run) -> None:
    assert "item 00001-000 ran out of memory; trying it once more, alone" in one_rank.stderr
    assert one_rank.meta("00001-000")["prompt"] == ROWS[1]["prompt"]
    from PIL import Image

    with Image.open(one_rank.output / "images" / "00010-000.png") as png:
        assert png.text["prompt"] == "a windmill\\x07 at\tdusk", "a PNG text chunk holds no control character"


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory, runtime_env, tiny_model, dataset: Path) -> Run:
    out = tmp_path_factory.mktemp("ds1") / "out"
    run = torchrun(spec_json(dataset_job(dataset), out, dataset), out, runtime_env, 1, extra_env=FAULTS)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_bad_rows_fail_alone_and_are_named(one_rank: Run) -> None:
    check_failed_and_named(one_rank)
    assert len(one_rank.images()) == len(ROWS) - len(BAD)
    job = json.loads((one_rank.output / "job.json").read_text())
    assert job["items"] == {"rendered": len(ROWS) - len(BAD), "failed": len(BAD)}


def test_two_ranks_render_the_same_data_set_byte_for_byte(tmp_path: Path, runtime_env, dataset: Path,
                                                            one_rank: Run) -> None:
    out = tmp_path / "ds2"
    run = torchrun(spec_json(dataset_job(dataset, processes=2), out, dataset), out, runtime_env, 2, extra_env=FAULTS)
    assert run.returncode == 0, run.stderr[-3000:]
    check_failed_and_named(run)
    assert run.images() == one_rank.images(), "the same pixels, whichever rank claimed which chunk"


def test_more_failures_than_allowed_fail_the_job_and_name_them(tmp_path: Path, runtime_env, dataset: Path) -> None:
    out = tmp_path / "strict"
    job = dataset_job(dataset)
    del job["runPolicy"]  # the default, 1%: none of 8 items may fail
    run = torchrun(spec_json(job, out, dataset), out, runtime_env, 1, extra_env=FAULTS)
    assert run.returncode == contract.PERMANENT_FAILURE_EXIT_CODE
    assert run.termination["permanent"] is True
    assert run.termination["message"] == (
        f"spec.runPolicy.maxFailedItems: 1 items failed, more than the 0 allowed (1% of {len(ROWS)} items, the "
        "default); "
        "first failed: 00002-000 (sku-2): column 'seed': seed 'not a number' is not an integer")


# -- systematic failures: a wrong column, every item failing ---------------------------------------

WIDE = [{"uid": f"u{i}", "caption": f"a photo of thing {i}", "seed": i} for i in range(40)]
NAN_ALL = {contract.MURALIST_TEST_NAN_ROWS: ",".join(str(i) for i in range(len(WIDE)))}


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wide")
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in WIDE))
    return root


def wide_job(wide: Path, prompt: str, **fields) -> dict:
    job = dataset_job(wide, **fields)
    job["dataset"]["columns"] = {"prompt": prompt, "seed": "seed", "id": "uid"}
    return job


def test_a_prompt_column_the_data_set_lacks_fails_before_any_item(tmp_path: Path, runtime_env, wide: Path) -> None:
    out = tmp_path / "column"
    run = torchrun(spec_json(wide_job(wide, "text"), out, wide), out, runtime_env, 1)
    assert run.returncode == contract.PERMANENT_FAILURE_EXIT_CODE, run.stderr[-3000:]
    assert run.termination["permanent"] is True
    assert run.termination["message"] == "spec.dataset.columns.prompt: no column 'text'; columns: uid, caption, seed"
    assert list(out.iterdir()) == [], "refused before the world, the model and the first item"
    assert "pipeline loaded" not in run.stderr


def test_a_systematic_failure_stops_the_job_after_its_first_chunks(tmp_path: Path, runtime_env, wide: Path) -> None:
    # Every output is NaN (as a wrong dtype gives): with no limit on failed items at all, the job
    # still stops once its first chunks (3 rows each here) have failed entirely.
    out = tmp_path / "nan"
    job = wide_job(wide, "caption", runPolicy={"maxFailedItems": "100%"})
    run = torchrun(spec_json(job, out, wide), out, runtime_env, 1, extra_env=NAN_ALL)
    assert run.returncode == contract.PERMANENT_FAILURE_EXIT_CODE, run.stderr[-3000:]
    assert run.termination["permanent"] is True
    nan = "the output has NaN or infinite values (the sampler diverged)"
    assert run.termination["message"] == (
        "items: no item completed: the first 4 chunks (12 items) all failed, a systematic failure that the rest "
        f"would share; first failed: 00000-000 (u0): {nan}; 00001-000 (u1): {nan}; 00002-000 (u2): {nan}")
    assert len(run.events("failed")) == 12, "4 chunks of 40 rows rendered, not the whole data set"
    assert run.termination["failed"] == 12


def test_a_job_whose_every_item_failed_is_never_a_success(tmp_path: Path, runtime_env, tiny_model) -> None:
    # Too small for the early rule (3 items): every chunk renders, then the merge refuses.
    out = tmp_path / "allfailed"
    job = make_job().obj()
    job["runPolicy"] = {"maxFailedItems": "100%"}
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 1,
                   extra_env={contract.MURALIST_TEST_NAN_ROWS: "0,1,2"})
    assert run.returncode == contract.PERMANENT_FAILURE_EXIT_CODE, run.stderr[-3000:]
    assert run.termination["permanent"] is True
    nan = "the output has NaN or infinite values (the sampler diverged)"
    assert run.termination["message"] == (
        f"items: every item failed (3), none completed; first failed: 00000-000: {nan}; 00001-000: {nan}; "
        f"00002-000: {nan}")
    assert [m["status"] for m in run.manifest()] == ["failed"] * 3, "merged all the same: each one's reason"
    assert json.loads((out / "job.json").read_text())["items"] == {"failed": 3}


def test_webdataset_shards_are_never_partial_and_read_back(tmp_path: Path, runtime_env, dataset: Path) -> None:
    out = tmp_path / "wds"
    job = dataset_job(dataset, processes=2, output={"layout": "webdataset", "shardSize": 3})
    spec = spec_json(job, out, dataset)
    # Rank 0 dies after writing its first image, and its pod with it: its shard stays a temp file.
    first = torchrun(spec, out, runtime_env, 2, extra_env={**FAULTS, contract.MURALIST_TEST_EXIT_AFTER: "1",
                                                             contract.MURALIST_TEST_EXIT_RANK: "-1"})
    assert first.returncode != 0
    for shard in (out / "shards").glob("*.tar"):
        with tarfile.open(shard) as tar:  # whatever is there under a shard's name is whole
            assert len(tar.getnames()) % 2 == 0
    # Temps of a pod killed elsewhere: fresh, so the start keeps them (their writer may be alive);
    # once the job has merged, none is needed.
    foreign = [out / "shards" / ".shard-000001.tar.other-pod-7.tmp",
               out / "parts" / ".chunk-000001.jsonl.other-pod-7.tmp"]
    for path in foreign:
        path.write_bytes(b"partial")
    retry = torchrun(spec, out, runtime_env, 2, extra_env=FAULTS)
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert sorted(p.name for p in (out / "shards").iterdir()) == [f"shard-{i:06d}.tar"
                                                                  for i in range(math.ceil(len(ROWS) / 3))]
    assert not list(out.rglob(".*.tmp")), "no temp left once the job has merged"
    members = {key: parts for path in sorted((out / "shards").glob("*.tar")) for key, parts in shards.read_shard(path)}
    index = shards.read_index(out / "index.parquet")
    assert [r["key"] for r in index] == [f"{i:05d}-000" for i in range(len(ROWS))]
    rendered = {r["key"] for r in index if r["status"] != "failed"}
    assert set(members) == rendered and all(set(parts) == {"png", "json"} for parts in members.values())
    assert {r["key"]: r["shard"] for r in index if r["key"] in rendered} == {
        k: int(k[:5]) // 3 for k in rendered}, "shard = chunk of 3 rows"
    wds = pytest.importorskip("webdataset")
    samples = list(wds.WebDataset([str(p) for p in sorted((out / "shards").glob("*.tar"))], shardshuffle=False))
    assert sorted(s["__key__"] for s in samples) == sorted(rendered)


def test_muralist_run_renders_a_parquet_data_set(tmp_path: Path, runtime_env, dataset: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist([{"caption": f"a red fox number {i}"} for i in range(6)]),
                   data / "rows.parquet", row_group_size=4)
    manifest = tmp_path / "job.yaml"
    spec = make_job().processes(2).obj()
    spec.pop("prompts")
    spec["dataset"] = {"volume": {"persistentVolumeClaim": {"claimName": "data"}}, "path": "rows.parquet",
                       "columns": {"prompt": "caption"}, "start": 1, "end": 5}
    manifest.write_text(yaml.safe_dump({"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob",
                                        "metadata": {"name": "pq"}, "spec": spec}))
    out = tmp_path / "out"
    cli = [sys.executable, "-m", "muralist_cli", "run", str(manifest), "--output", str(out)]
    refused = subprocess.run(cli, env=runtime_env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "--dataset-dir" in refused.stderr, "a PVC cannot be mounted here"
    proc = subprocess.run([*cli, "--dataset-dir", str(data)], env=runtime_env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    assert [(m["key"], m["prompt"]) for m in lines] == [(f"{i:05d}-000", f"a red fox number {i}") for i in range(1, 5)]


# -- rows of several sizes -----------------------------------------------------------------------------------

SIZED = [{"prompt": f"a shape number {i}", "h": h, "w": w}
         for i, (h, w) in enumerate([(32, 32), (48, 32), (32, 32), (32, 48), (48, 32), (None, None), (32, 48)])]


def test_rows_of_several_sizes_render_grouped_by_size_with_the_pixels_of_one_at_a_time(
        tmp_path: Path, runtime_env, tiny_model: Path) -> None:
    import numpy as np
    import torch
    from muralist_api.runtime_spec import RuntimeSpec
    from muralist_runtime.model import call, loading
    from muralist_runtime.work import rows

    data = tmp_path / "data"
    data.mkdir()
    (data / "rows.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n"
                                             for r in SIZED))
    job = make_job().generation(batchSize=2).obj()
    job.pop("prompts")
    job["dataset"] = {"volume": {"hostPath": {"path": str(data)}}, "path": "rows.jsonl",
                      "columns": {"prompt": "prompt", "height": "h", "width": "w"}}
    out = tmp_path / "sized"
    spec = spec_json(job, out, data)
    run = torchrun(spec, out, runtime_env, 1)
    assert run.returncode == 0, run.stderr[-3000:]
    for i, r in enumerate(SIZED):
        meta = run.meta(f"{i:05d}-000")
        assert (meta["height"], meta["width"]) == (r["h"] or 32, r["w"] or 32)
        assert run.pixels(f"{i:05d}-000").shape == (r["h"] or 32, r["w"] or 32, 3)

    # One item a call, in this process, at the job's batch size (render/batching.py pads every call to it).
    torch.set_num_threads(1)
    runtime = RuntimeSpec.model_validate_json(spec)
    pipe = loading.load_pipeline(runtime, str(tiny_model), None)
    source = rows.open_rows(runtime)
    for item in rows.items_of(source.rows(0, source.count()), runtime.spec.generation):
        alone, why = call.render_checked(pipe, runtime, [item], pad_to=2)[0]
        assert why is None
        assert np.array_equal(np.asarray(alone.image, dtype=np.int16), run.pixels(item.key)), item.key
