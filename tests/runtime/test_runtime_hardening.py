"""Production hardening under real torchrun (CPU, gloo): step heartbeats, hangs that end,
node-local staging with timings, the consistency canary, uneven context-parallel splits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from muralist_api import contract
from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE

from .conftest import make_job, runtime_spec_json, torchrun

pytestmark = pytest.mark.torchrun


def test_step_callback_fires_once_per_step(tiny_model: Path) -> None:
    from muralist_api.items import row_items
    from muralist_api.runtime_spec import RuntimeSpec
    from muralist_runtime.model import call, loading

    job = make_job().obj()
    runtime = RuntimeSpec.model_validate({"name": "t", "spec": job, "outputDir": "/unused"})
    pipe = loading.load_pipeline(runtime, str(tiny_model), None)
    task = row_items(0, "a red fox", runtime.spec.generation)[0]
    steps: list[int] = []
    images = call.render(pipe, runtime, [task], on_step=lambda: steps.append(1), steps=3)
    assert len(images) == 1 and len(steps) == 3


def test_a_hung_rank_fails_its_pod_and_the_retry_finishes(tmp_path: Path, runtime_env, tiny_model) -> None:
    # Rank 1 blocks forever after its first image, holding its chunk. The pod ends (retryable)
    # once rank 1 has been silent for collectiveTimeoutSeconds, instead of hanging; its retry
    # renders only what is missing. Rank 0 is slowed (2 s a step) so that it cannot claim all
    # three items before rank 1 has loaded: work is claimed, not dealt.
    out = tmp_path / "hang"
    job = make_job().processes(2).obj()
    job["parallelism"]["collectiveTimeoutSeconds"] = 10
    spec = runtime_spec_json(job, out)
    start = time.monotonic()
    run = torchrun(spec, out, runtime_env, 2, timeout=180,
                   extra_env={contract.MURALIST_TEST_HANG_AFTER: "1", contract.MURALIST_TEST_HANG_RANK: "1",
                              contract.MURALIST_TEST_STEP_SLEEP: "2", contract.MURALIST_TEST_SLOW_RANK: "0"})
    elapsed = time.monotonic() - start
    assert run.returncode != 0
    assert "rank 1 blocks forever" in run.stderr
    assert run.termination["permanent"] is False and run.termination["reason"] == "Error"
    assert "made no progress for" in run.termination["message"]
    assert elapsed < 120, f"took {elapsed:.0f}s"
    kept = sorted(p.stem for p in (out / "images").glob("*.png"))
    retry = torchrun(spec, out, runtime_env, 2)
    assert retry.returncode == 0, retry.stderr[-3000:]
    keys = ["00000-000", "00001-000", "00002-000"]
    assert [m["key"] for m in retry.manifest()] == keys
    assert sorted(e["key"] for e in retry.events("completed")) == sorted(set(keys) - set(kept))
    print(f"hung rank: pod ended after {elapsed:.1f}s (collective timeout 10s)")


def test_staging_copies_once_per_node_and_reports_timings(tmp_path: Path, runtime_env,
                                                         tiny_model) -> None:
    stage_dir = tmp_path / "stage"
    env = {**runtime_env, contract.MURALIST_STAGE_DIR: str(stage_dir)}
    job = make_job().processes(2).obj()
    job["prompts"] = job["prompts"][:2]
    job["model"]["loading"] = {"stage": True, "noMmap": True}
    first = torchrun(runtime_spec_json(job, tmp_path / "a"), tmp_path / "a", env, 2)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr.count("muralist.stage: staged ") == 1, "local rank 0 copies, once"
    staged = [p for p in stage_dir.iterdir() if not p.name.startswith(".")]
    assert len(staged) == 1 and (staged[0] / ".muralist-staged").is_file()
    assert (staged[0] / "model_index.json").is_file()
    doc = json.loads((tmp_path / "a" / "job.json").read_text())
    assert doc["loadSeconds"] > 0 and doc["generateSeconds"] > 0
    assert first.termination["loadSeconds"] > 0 and first.termination["generateSeconds"] > 0

    second = torchrun(runtime_spec_json(job, tmp_path / "b"), tmp_path / "b", env, 2)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "muralist.stage: staged " not in second.stderr
    assert second.stderr.count("muralist.stage: model already staged") == 2
    print(f"timings: first {first.termination['loadSeconds']}s load, second "
          f"{second.termination['loadSeconds']}s load")


def test_verify_canary_passes_for_ulysses_2(tmp_path: Path, runtime_env, tiny_model) -> None:
    out = tmp_path / "verify"
    job = make_job().processes(2).context_parallel(ulysses=2).obj()
    job["parallelism"]["verify"] = True
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "verify (group 0): max" in run.stderr
    assert run.termination["verifySeconds"] > 0
    assert len(run.manifest()) == 3


def test_verify_canary_fails_a_broken_layout_permanently(tmp_path: Path, runtime_env,
                                                         tiny_model) -> None:
    out = tmp_path / "broken"
    job = make_job().processes(2).context_parallel(ulysses=2).obj()
    job["parallelism"]["verify"] = True
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 2,
                   extra_env={contract.MURALIST_TEST_BREAK_CP: "1"})
    assert run.returncode != 0
    assert run.termination["permanent"] is True
    assert run.termination["exitCode"] == PERMANENT_FAILURE_EXIT_CODE
    message = run.termination["message"]
    assert message.startswith("spec.parallelism.verify: parallel output differs from "
                              "single-rank output by max "), message
    assert "layout ContextParallel ring 1 x ulysses 2, native, group 0" in message
    assert not list((out / "images").glob("*.png")), "no job image was rendered"


def test_uneven_sequence_on_cpu_is_refused_before_loading(tmp_path: Path, runtime_env,
                                                          tiny_model) -> None:
    # diffusers' ulysses_anything (used on GPUs) allocates CUDA tensors: on CPU, exit 78.
    out = tmp_path / "uneven"
    job = make_job().processes(2).context_parallel(ulysses=2).obj()
    job["generation"]["extraArgs"] = {"max_sequence_length": 15}  # 15 tokens over 2 ranks
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 2, timeout=120)
    assert run.returncode != 0
    assert run.termination.get("exitCode") == PERMANENT_FAILURE_EXIT_CODE, run.stderr[-4000:]
    assert run.termination["message"] == (
        "spec.generation.extraArgs.max_sequence_length: text sequence of 15 tokens is not "
        "divisible by ringDegree x ulyssesDegree 2; use a multiple of 2 (uneven splits need GPUs)")
    assert "loadSeconds" not in run.termination, "refused before loading"
