"""The runtime under real torchrun (CPU, gloo): layouts render the reference images."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from muralist_api import contract
from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE
from muralist_runtime.model import shapes
from PIL import Image

from .conftest import Run, as_a_pod, make_job, runtime_spec_json, torchrun

pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[2]


def assert_each_image_once(run: Run, keys: list[str]) -> None:
    rendered = [e["key"] for e in run.events("completed")]
    assert sorted(rendered) == keys, "every image rendered exactly once"
    assert [m["key"] for m in run.manifest()] == keys
    assert not list(run.output.rglob(".*.tmp")), "no temp files left"


def max_pixel_diff(a: Run, b: Run) -> int:
    worst = 0
    for name in a.images():
        x = np.asarray(Image.open(a.output / "images" / name), dtype=np.int16)
        y = np.asarray(Image.open(b.output / "images" / name), dtype=np.int16)
        worst = max(worst, int(np.abs(x - y).max()))
    return worst


KEYS = ["00000-000", "00001-000", "00002-000"]


def test_reference_layout(reference: Run) -> None:
    assert_each_image_once(reference, KEYS)
    job = json.loads((reference.output / "job.json").read_text())
    assert job["world"] == {"worldSize": 1, "groupSize": 1, "dataParallelDegree": 1,
                            "nodes": 1, "processesPerNode": 1, "podsPerWorld": 1}
    assert job["items"] == {"rendered": 3}
    assert set(job["versions"]) == {"python", "torch", "diffusers", "transformers", "accelerate"}
    assert reference.termination["completed"] == 3
    lines = [line for line in reference.stdout.splitlines() if line.startswith(contract.PROGRESS_LINE_PREFIX)]
    assert len(lines) == 3 and json.loads(lines[-1].split(" ", 1)[1])["completed"] == 3
    assert "00002-000.png" in (reference.output / "index.html").read_text()


def test_data_parallel_two_processes_match_one(tmp_path: Path, runtime_env, reference: Run) -> None:
    # 3 prompts claimed by 2 ranks: each exactly once, byte-identical PNGs, whoever took which.
    from tests.unit.runtime.report.test_push import FakeOperator

    operator = FakeOperator()  # live progress: the pod's first rank posts its ranks' counts
    token = tmp_path / "token"
    token.write_text("pod-token")
    out = tmp_path / "dp2"
    env = {contract.MURALIST_PROGRESS_URL: contract.progress_url(operator.base, "ns", "t"),
           contract.MURALIST_PROGRESS_TOKEN: str(token), contract.MURALIST_ATTEMPT: "1"}
    try:
        run = torchrun(runtime_spec_json(make_job().processes(2).obj(), out), out, runtime_env, 2, extra_env=env)
    finally:
        operator.close()
    assert run.returncode == 0, run.stderr[-3000:]
    assert_each_image_once(run, KEYS)
    assert run.images() == reference.images()
    final = operator.posts[-1]["body"]
    assert (final["attempt"], final["ranks"], final["completed"], final["total"], final["final"], final["done"]) == (
        1, 2, 3, 3, True, True)
    assert operator.posts[-1]["auth"] == "Bearer pod-token"
    # The termination message, the final word on a pod, counts all its ranks and the job's total.
    assert (run.termination["completed"], run.termination["total"]) == (3, 3)


def test_two_nodes_one_process_each(tmp_path: Path, runtime_env, reference: Run) -> None:
    out = tmp_path / "nodes2"
    run = torchrun(runtime_spec_json(make_job().processes(1, nodes=2).obj(), out), out,
                   runtime_env, nproc=1, nnodes=2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_each_image_once(run, KEYS)
    assert json.loads((out / "job.json").read_text())["world"]["nodes"] == 2
    assert run.images() == reference.images()
    # The second pod, retried after the first one merged the job and left, has nothing to do.
    from muralist_runtime import local

    spec_file = out.parent / f"{out.name}.spec.json"
    runtime = local.RuntimeSpec.model_validate_json(spec_file.read_text())
    argv, env = local.agent_commands(runtime, str(spec_file), *local.local_ports(2))[1]
    late = subprocess.run(argv, env={**runtime_env, **env}, capture_output=True, text=True, timeout=120)
    assert late.returncode == 0, late.stderr[-3000:]
    assert "nothing to do: the job was merged" in late.stderr


def test_killed_rank_then_resume_renders_only_missing(tmp_path: Path, runtime_env,
                                                      reference: Run) -> None:
    out = tmp_path / "resume"
    spec = runtime_spec_json(make_job().processes(2).obj(), out)
    # The first rank to write an image dies right after, taking its pod down (with claimed work,
    # which rank renders what is not fixed).
    first = torchrun(spec, out, runtime_env, 2, extra_env={contract.MURALIST_TEST_EXIT_AFTER: "1",
                                                             contract.MURALIST_TEST_EXIT_RANK: "-1"})
    assert first.returncode != 0
    kept = sorted(p.stem for p in (out / "images").glob("*.png"))
    assert 1 <= len(kept) < len(KEYS)
    (out / "images" / f".00001-000.png.{socket.gethostname()}-999999.tmp").write_bytes(b"partial")  # a killed write

    second = torchrun(spec, out, runtime_env, 2)
    assert second.returncode == 0, second.stderr[-3000:]
    assert sorted(e["key"] for e in second.events("completed")) == sorted(set(KEYS) - set(kept)), (
        "only what was missing is rendered again")
    assert sorted(e["key"] for e in second.events("skipped")) == kept
    assert [m["key"] for m in second.manifest()] == KEYS
    assert not list(out.rglob(".*.tmp")), "no temp files left"
    assert second.images() == reference.images()


def test_context_parallel_ulysses_2(tmp_path: Path, runtime_env, reference: Run) -> None:
    # Item 1's call raises inside the pipeline on both ranks of the group, item 2's runs out of memory
    # once: the group agrees to fail the first alone and to try the second once more, and goes on.
    out = tmp_path / "cp"
    job = make_job().processes(2).context_parallel(ulysses=2).run_policy(maxFailedItems=1).obj()
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 2,
                   extra_env={contract.MURALIST_TEST_RAISE_ROWS: "1", contract.MURALIST_TEST_OOM_ROWS: "2"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(e["key"] for e in run.events("completed")) == ["00000-000", "00002-000"]
    assert [(m["key"], m["status"]) for m in run.manifest()] == [
        ("00000-000", "rendered"), ("00001-000", "failed"), ("00002-000", "rendered")]
    assert run.manifest()[1]["error"] == "InjectedFailure: MURALIST_TEST_RAISE_ROWS: the call of row 1 fails"
    assert {m["rank"] for m in run.manifest()} == {0}, "only the group's first rank writes"
    assert max_pixel_diff(run, reference) <= 1


def test_a_context_parallel_group_over_two_pods_matches_one_process(tmp_path: Path, runtime_env,
                                                                   reference: Run) -> None:
    # Ulysses 2 with one process per pod: the group spans both pods, which (and only which)
    # rendezvous with each other through the PET_* contract.
    out = tmp_path / "cp-span"
    job = make_job().processes(1, nodes=2).context_parallel(ulysses=2).obj()
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 1, nnodes=2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_each_image_once(run, KEYS)
    assert json.loads((out / "job.json").read_text())["world"]["podsPerWorld"] == 2
    assert max_pixel_diff(run, reference) <= 1


def on_gpu_nodes(builder):
    """A layout admission accepts (2 GPUs per pod), started on this GPU-less machine."""
    builder.world(gpus=2, processes=2)
    return builder.obj()


def test_context_parallel_two_groups_of_two(tmp_path: Path, runtime_env, reference: Run) -> None:
    # World 4 = DP 2 x Ulysses 2: a (dp, ring, ulysses) mesh, each group's sub-mesh to diffusers.
    out = tmp_path / "cp4"
    job = make_job().processes(4).context_parallel(ulysses=2).obj()
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 4)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_each_image_once(run, KEYS)
    assert {m["rank"] for m in run.manifest()} <= {0, 2}, "the first rank of each group writes"
    assert json.loads((out / "job.json").read_text())["world"]["dataParallelDegree"] == 2
    assert max_pixel_diff(run, reference) <= 1


@pytest.mark.parametrize(
    ("job", "field"),
    [
        (on_gpu_nodes(make_job().tensor_parallel(2)), "spec.parallelism.gpusPerNode"),
        (on_gpu_nodes(make_job().context_parallel(ring=2, ulysses=1, backend="flash")),
         "spec.parallelism.contextParallel.attentionBackend"),
    ],
    ids=["tensor-parallel-on-cpu", "ring-attention-on-cpu"],
)
def test_permanent_failures_exit_78(tmp_path: Path, runtime_env, tiny_model, job, field) -> None:
    out = tmp_path / "bad"
    # Admission accepts these; only the runtime, on the machine, can see that they cannot run.
    start = time.monotonic()
    run = torchrun(runtime_spec_json(job, out), out, runtime_env, 2, timeout=120)
    assert run.returncode == PERMANENT_FAILURE_EXIT_CODE, run.stderr[-4000:]
    # One line for the pod, from the launch entry point (both ranks fail, neither prints it),
    # and not torchrun's report of the first failed worker.
    lines = [line for line in run.stderr.splitlines() if line.startswith(f"muralist: {field}:")]
    assert len(lines) == 1 and lines[0].endswith(f"(exit {PERMANENT_FAILURE_EXIT_CODE}: permanent, not retried)"), (
        run.stderr[-3000:])
    assert "ChildFailedError" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.termination["permanent"] is True
    assert run.termination["exitCode"] == PERMANENT_FAILURE_EXIT_CODE
    assert run.termination["message"].startswith(field)
    assert time.monotonic() - start < 100, "no rank waits on a collective"


def test_muralist_run_with_accelerate_launcher(tmp_path: Path, runtime_env, reference: Run) -> None:
    import yaml

    job = make_job().processes(2).launcher("accelerate").obj()
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "muralist.dev/v1alpha1",
                                        "kind": "DiffusionJob", "metadata": {"name": "acc"},
                                        "spec": job}))
    out = tmp_path / "acc"
    proc = subprocess.run([sys.executable, "-m", "muralist_cli", "run", str(manifest),
                           "--output", str(out)], env=runtime_env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Run(0, proc.stdout, proc.stderr, out)
    assert [m["key"] for m in run.manifest()] == KEYS
    assert run.images() == reference.images()
    assert f"gallery: {out / 'index.html'}" in proc.stdout


def test_quickstart_example(tmp_path: Path, runtime_env) -> None:
    # As a newcomer runs it: its ranks fork from the zygote its launch entry point starts (a CPU pod's warm
    # start, world/zygote.py), not from the test session's.
    out = tmp_path / "quickstart"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "muralist_cli", "run",
                           str(REPO / "examples" / "quickstart-cpu.yaml"), "--output", str(out)],
                          env=as_a_pod(runtime_env), capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((out / "images").glob("*.png"))) == 16
    assert len((out / "manifest.jsonl").read_text().splitlines()) == 16
    assert (out / "index.html").exists()
    # The quickstart's model is trained: how much of its gallery shows what each prompt names
    # (tests/runtime/test_runtime_tiny_shapes.py holds the model to its bar).
    run = Run(0, proc.stdout, proc.stderr, out)
    score = shapes.adherence([(m["prompt"], run.pixels(m["key"])) for m in run.manifest()])
    print(f"quickstart: {elapsed:.1f}s, prompt adherence {score:.0%}")
    assert elapsed < 60
