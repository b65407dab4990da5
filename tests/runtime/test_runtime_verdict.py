"""One line for one cause, under real launchers: a permanent failure prints its verdict once
(field, message, exit code) and no launcher report; a retryable one keeps its traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE

from .conftest import make_job, runtime_spec_json, torchrun

pytestmark = pytest.mark.torchrun

LAUNCHER_REPORT = ("ChildFailedError", "Traceback", "CalledProcessError", "exitcode")


@pytest.mark.parametrize(("launcher", "processes"), [("torchrun", 2), ("accelerate", 1)],
                         ids=["torchrun-2-ranks", "accelerate-1-rank"])
def test_muralist_run_prints_a_permanent_verdict_once(tmp_path: Path, runtime_env, tiny_model, launcher: str,
                                                     processes: int) -> None:
    # A data set whose file is missing: every rank finds out, and exits 78. torchrun reports
    # the failed worker with ChildFailedError; accelerate with one process, CalledProcessError.
    spec = make_job().processes(processes).launcher(launcher).obj()
    spec.pop("prompts")
    spec["dataset"] = {"volume": {"hostPath": {"path": str(tmp_path)}}, "path": "rows.jsonl",
                       "columns": {"prompt": "prompt"}}
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob",
                                        "metadata": {"name": "missing"}, "spec": spec}))
    proc = subprocess.run([sys.executable, "-m", "muralist_cli", "run", str(manifest), "--output",
                           str(tmp_path / "out")], env=runtime_env, capture_output=True, text=True, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == PERMANENT_FAILURE_EXIT_CODE, output[-3000:]
    verdict = (f"muralist: spec.dataset: {tmp_path / 'rows.jsonl'}: no such file or folder "
               f"(exit {PERMANENT_FAILURE_EXIT_CODE}: permanent, not retried)")
    assert output.count("spec.dataset:") == 1 and verdict in output.splitlines(), output[-3000:]
    assert not [word for word in LAUNCHER_REPORT if word in output], output[-3000:]


def test_a_retryable_failure_keeps_the_workers_traceback(tmp_path: Path, runtime_env, tiny_model) -> None:
    # The output folder's parent is a file: the rank fails with an OSError, which a retry (once
    # the volume is fixed) can cure. Its traceback and torchrun's report stay; no verdict line.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    spec = json.loads(runtime_spec_json(make_job().obj(), blocker / "out"))
    run = torchrun(json.dumps(spec), tmp_path / "out", runtime_env, 1, timeout=180)
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.termination["reason"] == "Error" and run.termination["permanent"] is False
    worker_traceback = run.stderr.split("NotADirectoryError:")[0]
    assert "Traceback (most recent call last):" in worker_traceback, run.stderr[-3000:]
    assert 'muralist_runtime/main.py", line' in worker_traceback, "the worker's own frames"
    assert "ChildFailedError" in run.stderr, "no verdict to replace it: torchrun's report stays"
    assert "permanent, not retried" not in run.stderr
