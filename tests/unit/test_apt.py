"""tests/apt.py: test workers that install packages at once take turns (apt refuses to run beside
another apt), and each apt-get waits for dpkg's lock rather than failing at once."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests import apt

FAKE_APT = """#!/bin/sh
echo "start $*" >> "$APT_LOG"
sleep 0.3
echo "end $*" >> "$APT_LOG"
"""


@pytest.fixture
def fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT)
    (bin_dir / "apt-get").chmod(0o755)
    log = tmp_path / "apt.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("APT_LOG", str(log))
    monkeypatch.setattr(apt, "LOCK", tmp_path / "apt.lock")
    return log


def test_two_installs_at_once_take_turns_and_wait_for_dpkg(fake_apt: Path) -> None:
    results: list[str | None] = []
    workers = [threading.Thread(target=lambda p=p: results.append(apt.install([p]))) for p in ("chromium", "docker.io")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert results == [None, None]
    lines = fake_apt.read_text().splitlines()
    assert len(lines) == 8
    # Each apt-get ends before the next starts, and one install's update and install run back to back.
    assert [line.split()[0] for line in lines] == ["start", "end"] * 4
    packages = [line.split()[-1] for line in lines if "install" in line]
    assert packages[0] == packages[1] and packages[2] == packages[3] and packages[0] != packages[2]
    assert all("-o DPkg::Lock::Timeout=" in line for line in lines)


def test_a_failing_apt_get_is_reported_with_its_command(fake_apt: Path, tmp_path: Path) -> None:
    (tmp_path / "bin" / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package nope' >&2\nexit 100\n")
    failed = apt.install(["nope"])
    assert failed is not None and "update failed (100)" in failed and "Unable to locate package" in failed
