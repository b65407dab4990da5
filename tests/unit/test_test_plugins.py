"""The suite's own split over pytest-xdist workers (tests/parallel_plugin.py) and its end-of-run
summary from every worker (tests/summary_plugin.py), on a small suite run the way hack/test.sh
runs the real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import REPO

pytest_plugins = ["pytester"]

HEADER = '''
import os
import pytest
from tests import summary_plugin

def record(kind):
    with open(os.environ["WHO_RAN"], "a") as f:
        f.write(f"{kind} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")
'''
REAL_NODE_TESTS = '''
@pytest.mark.e2e
@pytest.mark.parametrize("n", range(3))
def test_node(n):
    record("real-node")

@pytest.mark.docker
def test_image():
    record("real-node")
'''
OTHER_TESTS = '''
@pytest.mark.parametrize("n", range(6))
def test_cpu(n, pytestconfig):
    record("other")
    with summary_plugin.timed(pytestconfig, "setup step timings (demo)", "a step"):
        pass
    summary_plugin.note(pytestconfig, "logs kept", "demo", "/tmp/demo-logs")
'''
CONFTEST = '''
pytest_plugins = ["tests.summary_plugin", "tests.parallel_plugin"]

def pytest_configure(config):
    for marker in ("e2e", "docker"):
        config.addinivalue_line("markers", marker + ": demo")
'''
PARALLEL = ("-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope", "--no-loadscope-reorder")


def write(pytester: pytest.Pytester, path: str, *parts: str) -> None:
    target = pytester.path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join((HEADER, *parts)))


@pytest.fixture
def who_ran(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A suite of three files (other tests first in collection order), and where each test notes its worker."""
    pytester.makeconftest(CONFTEST)
    write(pytester, "tests/cli/test_a.py", OTHER_TESTS)
    write(pytester, "tests/e2e/test_b.py", REAL_NODE_TESTS)
    write(pytester, "tests/image/test_c.py", REAL_NODE_TESTS)
    write(pytester, "tests/unit/test_d.py", OTHER_TESTS)
    monkeypatch.setenv("WHO_RAN", str(tmp_path / "who-ran"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return tmp_path / "who-ran"


def runs(who_ran: Path) -> list[tuple[str, str]]:
    return [(kind, worker) for kind, worker in (line.split() for line in who_ran.read_text().splitlines())]


def test_the_real_node_chain_runs_on_one_worker_and_the_summary_gathers_every_worker(
    pytester: pytest.Pytester, who_ran: Path
) -> None:
    result = pytester.runpytest_subprocess(*PARALLEL)
    result.assert_outcomes(passed=20)
    (node_worker,) = {worker for kind, worker in runs(who_ran) if kind == "real-node"}
    others = {worker for kind, worker in runs(who_ran) if kind == "other"}
    assert others - {node_worker}, "the other worker runs the rest"
    text = result.stdout.str()
    assert "setup step timings (demo)" in text and "/tmp/demo-logs" in text
    tagged = {worker for worker in others if f"a step [{worker}]" in text}
    assert tagged == others, "every worker's timings reach the summary, tagged with the worker"


def test_without_workers_the_real_node_chain_comes_first(pytester: pytest.Pytester, who_ran: Path) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=20)
    assert [kind for kind, _ in runs(who_ran)] == ["real-node"] * 8 + ["other"] * 12
    assert "a step " in result.stdout.str() and "/tmp/demo-logs" in result.stdout.str()


def test_a_real_node_test_outside_its_folders_is_refused(pytester: pytest.Pytester, who_ran: Path) -> None:
    write(pytester, "tests/unit/test_e.py", REAL_NODE_TESTS)
    result = pytester.runpytest_subprocess(*PARALLEL)
    result.assert_outcomes(passed=20, errors=4)  # at setup: the test never runs
    result.stdout.fnmatch_lines(["ERROR tests/unit/test_e.py::test_image - Failed: a test marked docker or e2e*"])
    assert "must live in tests/e2e/, tests/image/" in result.stdout.str()
