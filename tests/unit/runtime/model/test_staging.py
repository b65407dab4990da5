"""Node-local staging's waits (model/staging.py): a waiter follows the stager's heartbeat, and a stager that
stops beating fails its waiters after the bound instead of holding them forever."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from muralist_api import contract
from muralist_runtime.model import staging


@pytest.fixture
def stage_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(contract.MURALIST_STAGE_DIR, str(tmp_path / "stage"))
    return tmp_path / "stage"


def model(tmp_path: Path) -> Path:
    src = tmp_path / "model"
    src.mkdir()
    (src / "model_index.json").write_text("{}")
    return src


def test_a_waiting_rank_fails_once_the_stager_is_quiet_for_the_bound(tmp_path: Path, stage_dir: Path) -> None:
    dst = staging.staged_path(str(model(tmp_path)), None)
    dst.parent.mkdir(parents=True)
    staging._heartbeat_path(dst).touch()  # a stager that beat once, then hung
    start = time.monotonic()
    with pytest.raises(staging.StagingStalled, match=r"^waited \d+s for local rank 0 to stage model-\w+ with no "
                                                      r"sign of progress"):
        staging.stage_model(str(tmp_path / "model"), None, local_rank=1, quiet_seconds=1.0)
    assert time.monotonic() - start < 5


def test_a_waiting_rank_follows_a_stager_that_beats(tmp_path: Path, stage_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging, "HEARTBEAT_SECONDS", 0.1)
    src = model(tmp_path)
    copying = threading.Event()
    real_copy = staging._copy

    def slow_copy(a: Path, b: Path) -> None:  # a copy three times as long as the waiters' bound
        copying.set()
        time.sleep(1.5)
        real_copy(a, b)

    monkeypatch.setattr(staging, "_copy", slow_copy)
    stager = threading.Thread(target=staging.stage_model, args=(str(src), None, 0, 0.5))
    stager.start()
    assert copying.wait(5)
    dst, copied = staging.stage_model(str(src), None, local_rank=1, quiet_seconds=0.5)
    stager.join()
    assert (dst / staging.MARKER).is_file() and not copied


def test_another_pod_holding_the_node_lock_without_beating_fails_the_wait(tmp_path: Path, stage_dir: Path) -> None:
    import fcntl

    src = model(tmp_path)
    dst = staging.staged_path(str(src), None)
    dst.parent.mkdir(parents=True)
    with open(dst.parent / f".{dst.name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another pod's process: stuck before it beat at all
        with pytest.raises(staging.StagingStalled, match="another pod of this node to stage"):
            staging.stage_model(str(src), None, local_rank=0, quiet_seconds=0.5)
