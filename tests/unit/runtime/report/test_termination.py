"""The termination message: the pod contract's summary, written safely by every local rank."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from muralist_api import contract
from muralist_api.contract import Counts, Termination
from muralist_runtime.report import termination


def summary(counts: Counts, code: int, permanent: bool, reason: str, message: str,
            timings: dict[str, float] | None = None) -> Termination:
    return Termination(counts, code, permanent, reason, message, timings or {})


def test_termination_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "termination-log"
    monkeypatch.setenv("MURALIST_TERMINATION_LOG", str(path))
    report = summary(Counts(1, 2, 0, 5), 78, True, "PermanentFailure",
                            "spec.parallelism.gpusPerNode: " + "x" * 10000)
    assert len(report.to_json().encode()) <= 4096
    termination.write_termination(report)
    doc = json.loads(path.read_text())
    assert doc["exitCode"] == 78 and doc["permanent"] is True
    assert doc["message"].startswith("spec.parallelism.gpusPerNode: xxx")
    assert (doc["completed"], doc["skipped"], doc["total"]) == (1, 2, 5)


def _rank_fails(path: str, message_length: int, start: Any) -> None:
    os.environ["MURALIST_TERMINATION_LOG"] = path
    start.wait()
    termination.write_termination(summary(Counts(), 1, False, "Error", "x" * message_length))


def test_ranks_failing_together_leave_one_whole_termination_message(tmp_path: Path) -> None:
    # One container, every local rank writing its message at the same moment, messages of
    # different lengths: unlocked, their writes interleave into invalid JSON.
    fork = multiprocessing.get_context("fork")
    for pair in range(40):
        path = tmp_path / f"termination-log-{pair}"
        start = fork.Barrier(2)
        ranks = [fork.Process(target=_rank_fails, args=(str(path), n, start)) for n in (10, 3000)]
        for rank in ranks:
            rank.start()
        for rank in ranks:
            rank.join(timeout=30)
        assert len(json.loads(path.read_text())["message"]) in (10, 3000), f"pair {pair}"


def test_a_permanent_failure_is_not_replaced_by_another_ranks_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "termination-log"
    monkeypatch.setenv("MURALIST_TERMINATION_LOG", str(path))

    def write(reason: str, message: str) -> str:
        termination.write_termination(summary(Counts(), 1, reason == "PermanentFailure", reason, message))
        return json.loads(path.read_text())["message"]

    assert write("Error", "rank 1: collective aborted") == "rank 1: collective aborted"
    assert write("PermanentFailure", "spec.model.dtype: unsupported") == "spec.model.dtype: unsupported"
    assert write("Error", "rank 0: collective aborted") == "spec.model.dtype: unsupported"
    assert write("PermanentFailure", "spec.prompts: too long") == "spec.prompts: too long"


def test_no_termination_log_outside_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MURALIST_TERMINATION_LOG", raising=False)
    monkeypatch.setattr(contract, "TERMINATION_LOG", "/nonexistent/termination-log")
    assert termination.termination_log_path() is None
    termination.write_termination(Termination())  # silently nothing


def test_termination_summary_carries_timings() -> None:
    doc = json.loads(summary(Counts(total=1), 0, False, "Completed", "",
                             {"loadSeconds": 12.34567, "generateSeconds": 3.0}).to_json())
    assert (doc["loadSeconds"], doc["generateSeconds"]) == (12.346, 3.0)


def test_parse_reads_what_to_json_writes() -> None:
    report = summary(Counts(1, 2, 3, 6), 78, True, "PermanentFailure", "spec.x: bad", {"loadSeconds": 1.5})
    assert Termination.parse(report.to_json()) == report
    assert Termination.parse("Traceback (most recent call last):") is None
    assert contract.is_permanent(1, report.to_json()) and contract.is_permanent(78, "")
    assert not contract.is_permanent(1, "oom")


STOPPED_MID_WRITE = """
import os, signal, sys
from muralist_api import contract
from muralist_api.contract import Counts, Termination
from muralist_runtime.report import termination

real = Termination.to_json
def to_json(self):  # called after the file is truncated: torchrun's SIGTERM arrives right then
    os.kill(os.getpid(), signal.SIGTERM)
    return real(self)
Termination.to_json = to_json
termination.write_termination(Termination(Counts(), contract.PERMANENT_FAILURE_EXIT_CODE, True,
                                          "PermanentFailure", "spec.x: the second rank's words"))
print("not reached: the held SIGTERM acts once the message is whole")
"""


def test_a_rank_stopped_while_writing_leaves_a_whole_message(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "termination-log"
    first = Termination(Counts(), contract.PERMANENT_FAILURE_EXIT_CODE, True, "PermanentFailure",
                        "spec.x: the first rank's words")
    path.write_text(first.to_json())
    proc = subprocess.run([sys.executable, "-c", STOPPED_MID_WRITE], capture_output=True, text=True, timeout=60,
                          env={**os.environ, contract.MURALIST_TERMINATION_LOG: str(path)})
    assert proc.returncode == -15, proc.stderr
    assert "not reached" not in proc.stdout
    assert json.loads(path.read_text())["message"] == "spec.x: the second rank's words"
