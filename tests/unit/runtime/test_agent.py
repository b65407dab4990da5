"""The launcher agent (agent.py) and the verdict line: a permanent failure is one line, the
launcher's report of it is left out, and anything else is left as the launcher reports it."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from muralist_api import contract
from muralist_api.contract import Termination
from muralist_runtime import agent
from muralist_runtime.report.termination import permanent_verdict_line

PERMANENT = Termination(exit_code=78, permanent=True, reason="PermanentFailure",
                        message="spec.dataset: /data/rows.jsonl: no such file or folder")
RETRYABLE = Termination(exit_code=1, reason="Error", message="NotADirectoryError: [Errno 20] Not a directory: '/out'")


@pytest.fixture
def termination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(contract.MURALIST_TERMINATION_LOG, str(path))
    return path


@pytest.fixture
def failing_launcher(tmp_path: Path) -> Iterator[str]:
    """A launcher module that fails the way torchrun does once a worker has failed."""
    name = "fake_launcher_for_agent_tests"
    (tmp_path / f"{name}.py").write_text(
        "import sys\n"
        "class ChildFailedError(Exception):\n    pass\n"
        "raise ChildFailedError(f'muralist_runtime FAILED; argv {sys.argv[1:]}')\n")
    sys.path.insert(0, str(tmp_path))
    yield name
    sys.path.remove(str(tmp_path))
    sys.modules.pop(name, None)


def test_the_verdict_line_names_field_message_and_exit_code() -> None:
    assert permanent_verdict_line(PERMANENT.to_json()) == (
        "muralist: spec.dataset: /data/rows.jsonl: no such file or folder (exit 78: permanent, not retried)")
    assert permanent_verdict_line(RETRYABLE.to_json()) is None
    assert permanent_verdict_line("") is None and permanent_verdict_line("a log tail, not ours") is None


def test_after_a_permanent_verdict_the_launchers_failure_is_quiet(termination: Path, failing_launcher: str) -> None:
    termination.write_text(PERMANENT.to_json())
    assert agent.main([failing_launcher, "--spec", "x"]) == contract.PERMANENT_FAILURE_EXIT_CODE


@pytest.mark.parametrize("verdict", [RETRYABLE, None], ids=["retryable", "none-written"])
def test_otherwise_the_launchers_report_stays(termination: Path, failing_launcher: str,
                                               verdict: Termination | None) -> None:
    if verdict is not None:
        termination.write_text(verdict.to_json())
    with pytest.raises(Exception, match=r"muralist_runtime FAILED; argv \['--spec', 'x'\]") as raised:
        agent.main([failing_launcher, "--spec", "x"])
    assert type(raised.value).__name__ == "ChildFailedError"


def test_the_elastic_agents_warnings_are_dropped_only_after_a_permanent_verdict(termination: Path) -> None:
    def record(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, "api.py", 1, "failed (exitcode: %s)", (78,), None)

    quiet = agent._QuietAfterVerdict()
    elastic = "torch.distributed.elastic.multiprocessing.api"
    assert quiet.filter(record(elastic, logging.ERROR)), "no verdict yet"
    termination.write_text(PERMANENT.to_json())
    assert not quiet.filter(record(elastic, logging.ERROR))
    assert not quiet.filter(record(elastic, logging.WARNING))
    assert quiet.filter(record(elastic, logging.INFO))
    assert quiet.filter(record("torch.distributed.c10d", logging.ERROR)), "only the elastic agent's report"
    termination.write_text(RETRYABLE.to_json())
    assert quiet.filter(record(elastic, logging.ERROR))
