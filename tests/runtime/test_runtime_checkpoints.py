"""Checkpoints inside an item (runPolicy.checkpoint) under real torchrun on CPU: a video item stopped in the middle
resumes from its checkpoint and is the uninterrupted render, frame for frame and byte for byte: stopped by SIGTERM
under `muralist run` on one process; in a Ulysses group of 2 writing to a bucket; killed (SIGKILL) on one pod and
resumed by a job of two pods (a resize between the attempts), having lost fewer steps than everySteps.

One job for all (the tiny Wan, 16 steps, everySteps 4), rendered straight once as the reference."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from muralist_api import contract

from tests.s3_plugin import S3Server

from .conftest import Run, runtime_spec_json, torchrun

pytestmark = pytest.mark.torchrun

STEPS = 16
EVERY = 4
KEYS = ["00000-000", "00001-000"]
FIRST = KEYS[0]
SLOW = {contract.MURALIST_TEST_STEP_SLEEP: "0.25", contract.MURALIST_TEST_SLOW_RANK: "0"}  # a stop finds it mid-item


def job_spec(**parallelism: Any) -> dict[str, Any]:
    return {
        "model": {"name": "muralist/tiny-wan", "dtype": "float32"},
        "prompts": ["a red fox in a snowy forest", {"text": "a lighthouse in a storm", "seed": 42}],
        "generation": {"steps": STEPS, "height": 32, "width": 32, "numFrames": 9, "fps": 8,
                       "extraArgs": {"max_sequence_length": 16}},
        "parallelism": {"strategy": "DataParallel", "gpusPerNode": 0, "processesPerNode": 1, **parallelism},
        "output": {"format": "mp4"},
        "runPolicy": {"checkpoint": {"everySteps": EVERY}},
    }


def manifest_file(folder: Path, spec: dict[str, Any]) -> Path:
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob",
                                    "metadata": {"name": "ckpt"}, "spec": spec}))
    return path


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, runtime_env: dict[str, str], tiny_wan: Path) -> Run:
    """The job rendered without a stop: what every resumed render must equal."""
    out = tmp_path_factory.mktemp("straight") / "out"
    run = torchrun(runtime_spec_json(job_spec(), out), out, runtime_env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "checkpoints" not in {p.name for p in out.iterdir()}, "no checkpoint left once the items are written"
    return run


def stopped_mid_item(cli: list[str], env: dict[str, str], noted: Callable[[], int], deadline: float = 180
                     ) -> subprocess.CompletedProcess[str]:
    """`muralist run` told to stop (SIGTERM) once the first item's note says it has steps done."""
    proc = subprocess.Popen(cli, env={**env, **SLOW}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + deadline
    while noted() < 2 and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cli, proc.returncode, out, err)


def note_step(read: Callable[[], bytes]) -> int:
    try:
        return int(json.loads(read())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def assert_same_videos(run: Run, straight: Run) -> None:
    assert [m["key"] for m in run.manifest()] == KEYS
    for key in KEYS:
        assert (run.pixels(key, "mp4") == straight.pixels(key, "mp4")).all(), f"{key}: frame for frame"
    assert run.images("mp4") == straight.images("mp4"), "the same files"


def test_an_item_stopped_by_sigterm_resumes_from_its_checkpoint_under_muralist_run(tmp_path: Path, runtime_env,
                                                                                   straight: Run) -> None:
    out = tmp_path / "out"
    cli = [sys.executable, "-m", "muralist_cli", "run", str(manifest_file(tmp_path, job_spec())), "--output", str(out)]
    note = out / "checkpoints" / f"{FIRST}.json"
    stopped = stopped_mid_item(cli, runtime_env, lambda: note_step(note.read_bytes))
    assert stopped.returncode == contract.DRAINED_EXIT_CODE, stopped.stderr[-3000:]
    assert "muralist: stopped (SIGTERM); run the same command again to resume" in stopped.stderr
    saved_at = json.loads(note.read_text())["step"]
    assert f"item {FIRST} saved at step {saved_at} of {STEPS}" in stopped.stderr
    assert 2 <= saved_at < STEPS and (out / "checkpoints" / f"{FIRST}.pt").is_file()
    assert not (out / "manifest.jsonl").exists() and not (out / "images" / f"{FIRST}.mp4").exists()

    resumed = subprocess.run(cli, env=runtime_env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run = Run(0, resumed.stdout, resumed.stderr, out)
    assert_same_videos(run, straight)
    entry = run.manifest()[0]
    assert (entry["resumedFromStep"], entry["stepsSaved"], entry.get("stepsLost", 0)) == (saved_at, saved_at, 0)
    assert "resumedFromStep" not in run.manifest()[1]
    assert json.loads((out / "job.json").read_text())["checkpoints"] == {"resumed": 1, "stepsSaved": saved_at,
                                                                          "stepsLost": 0}
    assert not (out / "checkpoints").exists(), "deleted once the items are written"


def test_a_ulysses_group_writing_to_a_bucket_resumes_its_item(tmp_path: Path, runtime_env, straight: Run,
                                                             s3_server: S3Server) -> None:
    bucket = s3_server.bucket()
    spec = job_spec(strategy="ContextParallel", processesPerNode=2, contextParallel={"ulyssesDegree": 2})
    spec["output"] = {"format": "mp4", "uri": f"s3://{bucket}", "endpoint": s3_server.endpoint}
    cli = [sys.executable, "-m", "muralist_cli", "run", str(manifest_file(tmp_path, spec))]
    fs = s3_server.filesystem()
    prefix = f"{bucket}/ckpt"
    env = {**runtime_env, **s3_server.env}
    stopped = stopped_mid_item(cli, env, lambda: note_step(lambda: fs.cat_file(f"{prefix}/checkpoints/{FIRST}.json")))
    assert stopped.returncode == contract.DRAINED_EXIT_CODE, stopped.stderr[-3000:]
    held = {p.removeprefix(prefix + "/") for p in fs.find(prefix)}
    assert {f"checkpoints/{FIRST}.pt", f"checkpoints/{FIRST}.json"} <= held and "manifest.jsonl" not in held
    assert not [n for n in held if n.rsplit("/", 1)[-1].startswith(".")], "no temp object ever"
    saved_at = json.loads(fs.cat_file(f"{prefix}/checkpoints/{FIRST}.json"))["step"]

    resumed = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    local = tmp_path / "fetched"
    for path in fs.find(prefix):
        (local / path.removeprefix(prefix + "/")).parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(local / path.removeprefix(prefix + "/")))
    run = Run(0, resumed.stdout, resumed.stderr, local)
    assert_same_videos(run, straight)
    assert run.manifest()[0]["resumedFromStep"] == saved_at >= 2
    assert not [p for p in fs.find(prefix) if "/checkpoints/" in p], "deleted once the items are written"


def test_a_killed_rank_loses_fewer_steps_than_every_steps_and_a_resized_job_resumes_its_item(
        tmp_path: Path, runtime_env, straight: Run) -> None:
    out = tmp_path / "out"
    killed_at = 7  # the end of step 7: its checkpoint at step 4, its note at step 7
    killed = torchrun(runtime_spec_json(job_spec(), out), out, runtime_env,
                      extra_env={contract.MURALIST_TEST_KILL_AT_STEP: str(killed_at)})
    assert killed.returncode != 0 and "kills itself" in killed.stderr
    assert json.loads((out / "checkpoints" / f"{FIRST}.json").read_text())["step"] == killed_at

    # Resumed by a job of two pods (one process each): whichever claims the item's chunk resumes it.
    resized = job_spec()
    resized["parallelism"]["nodes"] = 2
    resized["output"]["volume"] = {"hostPath": {"path": str(out)}}
    run = torchrun(runtime_spec_json(resized, out), out, runtime_env, nnodes=2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_same_videos(run, straight)
    entry = run.manifest()[0]
    assert entry["resumedFromStep"] == 4 >= killed_at - EVERY, "at most everySteps lost"
    assert (entry["stepsLost"], entry["stepsSaved"]) == (killed_at - 4, 4)
    assert json.loads((out / "job.json").read_text())["checkpoints"] == {"resumed": 1, "stepsSaved": 4,
                                                                          "stepsLost": killed_at - 4}
