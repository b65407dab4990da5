"""The zygote (muralist_runtime/world/zygote.py): a rank forked from it ends as it would
have ended alone (exit code, signal), signals reach it, it dies with the process torchrun
watches, and a rank whose import-time environment differs starts the ordinary way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from muralist_runtime.world import zygote

from tests.kube_helpers import wait_for
from tests.paths import REPO

TARGET = "tests.unit.runtime.world.zygote_target"
# The rank's side: delegate to the zygote; the ordinary way prints "ordinary" and exits 3.
STUB = ("import sys; from muralist_runtime.world.zygote import delegate; "
        f"delegate({TARGET!r}); print('ordinary', flush=True); sys.exit(3)")


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with zygote.started(env, warm=False, timeout=60) as path:
        yield {**env, zygote.ZYGOTE_ENV: path}


def rank(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", STUB, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_forked_rank_exits_with_its_own_code_and_environment(served: dict[str, str]) -> None:
    proc = rank({**served, "MARK": "m1"}, "exit", "7")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7, err
    parent = int(out.split()[1])
    assert parent != proc.pid, "it ran in a child of the zygote, not in the process torchrun started"
    assert "mark m1" in out and "ordinary" not in out


def test_a_rank_killed_by_a_signal_ends_its_process_by_the_same_signal(served: dict[str, str]) -> None:
    proc = rank(served, "signal", str(int(signal.SIGKILL)))
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_signal_to_the_process_reaches_the_rank(served: dict[str, str], tmp_path: Path) -> None:
    proc = rank(served, "wait", str(tmp_path / "pid"))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_the_rank_dies_with_the_process_torchrun_started(served: dict[str, str], tmp_path: Path) -> None:
    proc = rank(served, "wait", str(tmp_path / "pid"))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
    child = int((tmp_path / "pid").read_text())
    proc.kill()  # SIGKILL: nothing is passed on; the child sees its pipe close
    proc.communicate(timeout=30)

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, timeout=20, interval=0.05, message=f"the forked rank {child} to die")


@pytest.mark.parametrize("change", [{"HF_HOME": "/elsewhere"}, {zygote.ZYGOTE_ENV: "/nonexistent/socket"}],
                         ids=["import-time-variable", "no-zygote"])
def test_a_rank_the_zygote_cannot_serve_starts_the_ordinary_way(served: dict[str, str],
                                                                 change: dict[str, str]) -> None:
    proc = rank({**served, **change}, "exit", "0")
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out.strip()) == (3, "ordinary"), err


def test_import_time_variables_are_compared_and_torchruns_own_are_not() -> None:
    base = {"HF_HOME": "/a", "OMP_NUM_THREADS": "1", "RANK": "0"}
    assert zygote.import_time_mismatch(base, {**base, "RANK": "1", "TORCHELASTIC_RUN_ID": "x",
                                              "TORCHINDUCTOR_CACHE_DIR": "/t"}) == []
    assert zygote.import_time_mismatch(base, {**base, "HF_HOME": "/b", "PYTHONHASHSEED": "0"}) == [
        "HF_HOME", "PYTHONHASHSEED"]


def test_off_starts_the_ordinary_way(served: dict[str, str]) -> None:
    proc = rank({**served, zygote.ZYGOTE_ENV: zygote.OFF}, "exit", "0")
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out.strip()) == (3, "ordinary"), err


def test_a_rank_that_comes_while_the_zygote_imports_waits_and_is_served(tmp_path: Path) -> None:
    """The pod's zygote listens before it imports: a rank that connects meanwhile waits in the backlog."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    path, importing = str(tmp_path / "s"), tmp_path / "importing"
    code = ("import gc, pathlib, sys, time; from muralist_runtime.world import zygote; "
            "zygote.preload = lambda modules: (pathlib.Path(sys.argv[2]).write_text(str(gc.isenabled())), "
            "time.sleep(2)); "
            "zygote.serve(sys.argv[1])")
    server = subprocess.Popen([sys.executable, "-c", code, path, str(importing)], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: importing.exists() and importing.read_text(), timeout=20, interval=0.02,
                 message="the zygote's imports to start")
        assert os.path.exists(path), "listening already"
        # The collector waits while the imports make what lives as long as the zygote (it would only walk it).
        assert importing.read_text() == "False"
        proc = rank({**env, zygote.ZYGOTE_ENV: path}, "exit", "5")
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 5 and "ordinary" not in out, err
        # What the imports made is frozen: the rank's collections do not walk (and copy) the zygote's objects.
        assert int(out.split("frozen ")[1].split()[0]) > 0, out
        assert "collecting True" in out, "the rank collects its own garbage"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_preloading_pauses_the_collector_and_freezes_what_it_made() -> None:
    """The imports' objects live as long as the process: no collection walks them while they are made, and
    none after (a rank started the ordinary way preloads so too: muralist_runtime/__main__.py)."""
    code = ("import gc, json; from muralist_runtime.world import zygote; collections = []; "
            "gc.callbacks.append(lambda phase, info: phase == 'start' and collections.append(info)); "
            "zygote.preload = lambda modules: [object() for _ in range(100)] + [[] for _ in range(5000)]; "
            "frozen = gc.get_freeze_count(); zygote.preload_unwatched([]); "
            "print(json.dumps([len(collections), gc.get_freeze_count() - frozen, gc.isenabled()]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    collections, frozen, collecting = json.loads(out.stdout)
    assert collections == 0 and collecting, out
    assert frozen > 0, "what the imports made is out of the collector's sight"
