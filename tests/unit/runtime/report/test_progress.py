"""A rank's progress: the JSON lines on stdout and the step times its rank file follows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from muralist_api import contract
from muralist_runtime.report import progress
from muralist_runtime.report.progress import RankProgress
from muralist_runtime.report.rank_files import RankFile, RankState


def test_progress_lines_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    prog = RankProgress(rank=2, job_total=2, writes=True, local=False)
    prog.item_done("00000-000", "skipped", 0.0)
    prog.item_done("00001-000", "completed", 1.23456)
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith(contract.PROGRESS_LINE_PREFIX) for line in lines)
    last = json.loads(lines[-1].removeprefix(contract.PROGRESS_LINE_PREFIX))
    assert last == {"event": "completed", "key": "00001-000", "rank": 2, "completed": 1,
                    "skipped": 1, "failed": 0, "total": 2, "rerendered": 0, "seconds": 1.2346}


def test_step_times_advance_with_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(f"2026-01-01T00:00:{s:02d}Z" for s in range(60))
    monkeypatch.setattr(progress, "now_iso", lambda: next(clock))
    rank_file = RankFile(tmp_path, 1, interval=0.01)
    prog = RankProgress(rank=1, job_total=3, writes=False, local=False, rank_file=rank_file)
    stamps = []
    for _ in range(3):
        prog.step_done()
        stamps.append(prog.state.last_step_time)
    assert stamps == sorted(stamps) and len(set(stamps)) == 3 and prog.steps == 3
    # The file follows from its own thread: the last step reaches it even if this thread hangs now.
    read = lambda: RankState.parse((tmp_path / "rank-1.json").read_text()).last_step_time  # noqa: E731
    deadline = time.monotonic() + 5
    while read() != stamps[-1] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read() == stamps[-1]


def test_steps_read_the_peak_memory_once_a_second_and_the_end_reads_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter(range(1, 100))
    read = []
    monkeypatch.setattr(progress.peak_memory, "peak_mib",
                        lambda: read.append(1) or (float(next(readings)), "VmHWM"))
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    prog = RankProgress(rank=1, job_total=5, writes=True, local=False)
    for item in range(5):  # five items of eight steps, in well under a second
        for _ in range(8):
            prog.step_done()
        prog.item_done(f"{item:05d}-000", "completed", 0.1)
    assert len(read) == 1 and prog.state.peak_memory_mib == 1.0
    now[0] += progress.PEAK_EVERY_SECONDS
    prog.step_done()
    assert len(read) == 2
    prog.finished()
    assert len(read) == 3 and prog.state.peak_memory_mib == 3.0, "the end's reading: the peak of the whole run"
