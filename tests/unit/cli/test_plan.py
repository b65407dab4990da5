"""`muralist plan`: the section strategy Auto would choose, as YAML that validates when put back, with one
reason per decision and the estimated peak per GPU; model sizes from a local folder's safetensors headers
or from the hub (the stand-in on loopback) by ranged reads, never a download of the weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from muralist_api.planner.known import KNOWN_MODELS
from muralist_api.rules.problems import parse_job
from muralist_cli import main

from tests.builders import make_job
from tests.hub_server import HubServer
from tests.planner_models import write_model

FLUX1, FLUX2 = "black-forest-labs/FLUX.1-dev", "black-forest-labs/FLUX.2-dev"


def manifest(tmp_path: Path, model: str, **parallelism: Any) -> tuple[Path, dict[str, Any]]:
    job = make_job("flux").set("spec.model", {"name": model}).generation(height=1024, width=1024, steps=28)
    job.set("spec.parallelism", {"strategy": "DataParallel", "gpusPerNode": 1, **parallelism})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job.obj()))
    return path, job.obj()


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def flux1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "flux1", KNOWN_MODELS[FLUX1])


def test_a_local_folder_planned_and_put_back(tmp_path: Path, flux1: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, job = manifest(tmp_path, FLUX1)
    code, out, err = plan(capsys, str(path), "--gpus-per-node", "8", "--gpu-memory", "24GiB", "--interconnect",
                          "nvlink", "--model", str(flux1))
    assert code == 0, err
    section = yaml.safe_load(out)["parallelism"]
    assert section == {"strategy": "TensorParallel", "nodes": 1, "gpusPerNode": 8, "tensorParallel": {"degree": 4}}
    job["spec"]["parallelism"] = section
    assert parse_job(job).spec.parallelism.tensor_parallel is not None  # muralist validate's rules pass
    comments = [line for line in out.splitlines() if line.startswith("#")]
    assert f"# model sizes: the safetensors headers in {flux1}" in comments
    reasons = [line.removeprefix("#   ") for line in comments if line.startswith("#   ")]
    assert [r.split(":")[0] for r in reasons] == ["weights", "tensor-parallel"]
    assert "31.4 GiB (transformer 22.2 GiB, text_encoder 235 MiB, text_encoder_2 8.9 GiB, vae 160 MiB)" in reasons[0]
    assert comments[-1].startswith("# estimated peak memory per GPU: 17.3 GiB (weights 14.8 GiB + max(")


def test_no_layout_fits_exits_1_with_the_figures(tmp_path: Path, flux1: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = manifest(tmp_path, FLUX1)
    code, out, err = plan(capsys, str(path), "--gpus-per-node", "8", "--gpu-memory", "24GiB", "--interconnect",
                          "pcie", "--model", str(flux1))
    assert (code, out) == (1, "")
    assert "spec.parallelism: transformer alone needs 22.5 GiB" in err and "tensor parallelism needs NVLink" in err
    code, _, err = plan(capsys, str(path), "--gpu-memory", "lots", "--model", str(flux1))
    assert code == 1 and "write it like 80GiB" in err


def test_a_hub_repo_is_read_by_ranged_requests(tmp_path: Path, hub_server: HubServer, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    repo = write_model(tmp_path / "flux2", KNOWN_MODELS[FLUX2])  # 105 GiB of weights, a few hundred KB on disk
    hub_server.reset()
    hub_server.add_repo(FLUX2, [repo])
    path, _ = manifest(tmp_path, FLUX2)
    code, out, err = plan(capsys, str(path), "--gpus-per-node", "2", "--gpu-memory", "80GiB", "--objective",
                          "latency")
    assert code == 0, err
    assert yaml.safe_load(out)["parallelism"]["strategy"] == "DeviceMap"
    assert f"# model sizes: the hub's safetensors metadata of {FLUX2}" in out
    # Each weight file's header, by one ranged request for its first 100 kB (followed to the "CDN"); nothing
    # of the weights themselves, and nothing of them in the hub cache.
    reads = [r for r in hub_server.seen(FLUX2) if (r.file or "").endswith(".safetensors") and r.method == "GET"]
    assert {r.file for r in reads if r.kind == "cdn"} == {p.relative_to(repo).as_posix()
                                                          for p in repo.rglob("*.safetensors")}
    assert {r.range for r in reads} == {"bytes=0-100000"} and {r.status for r in reads} <= {206, 302}
    assert all(p.stat().st_size < 1 << 20 for p in (tmp_path / "hf").rglob("*") if p.is_file())


def test_muralist_render_plans_an_auto_job_as_the_operator_would_without_node_labels(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = make_job("clip").set("spec.model", {"name": "muralist/tiny-wan", "dtype": "float32"}).prompts("a fox")
    job.generation(height=64, width=64, numFrames=17).output(format="mp4")
    job.set("spec.parallelism", {"strategy": "Auto", "objective": "latency", "gpusPerNode": 0,
                                 "processesPerNode": 2})
    path = tmp_path / "clip.yaml"
    path.write_text(yaml.safe_dump(job.obj()))
    assert main(["render", str(path)]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    runtime = yaml.safe_load(config_map["data"]["spec.json"])
    assert runtime["spec"]["parallelism"]["contextParallel"] == {"ulyssesDegree": 2}
    assert runtime["parallelPlan"]["reasons"][0].startswith("unknown-memory: ")  # no budget given
