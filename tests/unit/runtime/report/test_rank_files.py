"""Rank files: summed over every pod into the whole job's counts (and bar), torn writes skipped,
and the end-of-pod watchdog that fails a pod on a stalled rank."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from muralist_api.contract import Counts
from muralist_runtime.report import rank_files
from muralist_runtime.report.progress import RankProgress
from muralist_runtime.report.rank_files import RankFile, read_counts


def test_rank_files_of_all_pods_sum_to_the_whole_job(tmp_path: Path) -> None:
    pods = [tmp_path / "pod-0", tmp_path / "pod-1"]
    progs = [RankProgress(rank=r, job_total=12, writes=r != 3, local=True,
                          rank_file=RankFile(pods[r // 2], r, interval=60))
             for r in range(4)]
    for r, prog in enumerate(progs):
        for i in range(r + 1 if r != 3 else 0):
            prog.item_done(f"{r}-{i}", "skipped" if i == 0 else "completed", 0.0)
    assert read_counts(pods) == Counts(completed=0, skipped=0, failed=0, total=12), "throttled: the first write only"
    for prog in progs:
        prog.close()
    assert read_counts(pods) == Counts(completed=3, skipped=3, failed=0, total=12)
    (pods[0] / "rank-9.json").write_text("{not json")  # a torn write is skipped, not fatal
    assert read_counts(pods).total == 12


def test_local_bar_counts_every_rank_of_every_agent(tmp_path: Path) -> None:
    from muralist_runtime.local import JobBar

    pods = [tmp_path / "pod-0", tmp_path / "pod-1"]
    for r in range(2):
        prog = RankProgress(rank=r, job_total=16, writes=True, local=True, rank_file=RankFile(pods[r], r))
        for i in range(8):
            prog.item_done(str(i), "completed", 0.0)
        prog.close()
    with JobBar(pods, total=None) as bar:
        bar.refresh()
        assert (bar.bar.n, bar.bar.total) == (16, 16), "the whole job, not rank 0's share"


def test_the_pod_waits_for_its_ranks_and_fails_on_a_stalled_one(tmp_path: Path) -> None:
    done = RankProgress(rank=0, job_total=1, writes=True, local=True, rank_file=RankFile(tmp_path, 0))
    done.finished()
    rank_files.wait_for_pod(tmp_path, timeout=5)  # everyone done: returns at once
    RankProgress(rank=1, job_total=1, writes=True, local=True, rank_file=RankFile(tmp_path, 1))
    old = time.time() - 30
    os.utime(tmp_path / "rank-1.json", (old, old))  # rank 1 has not moved for 30 s
    with pytest.raises(rank_files.RankStalled, match=r"rank-1 of this pod made no progress for 3[0-9]s"):
        rank_files.wait_for_pod(tmp_path, timeout=10, poll=0.01)


def test_a_rank_waiting_for_handed_back_work_is_quiet_but_not_done(tmp_path: Path) -> None:
    progs = [RankProgress(rank=r, job_total=4, writes=True, local=True, rank_file=RankFile(tmp_path, r, interval=60))
             for r in range(2)]
    progs[0].finished()
    progs[1].idle(True)  # staying for chunks handed back
    pod = rank_files.read_pod([tmp_path])
    assert (pod.done, pod.quiet) == (False, True), "its pod's first rank still waits for it; no stall either"
    progs[1].idle(False)  # took one: rendering again
    assert rank_files.read_pod([tmp_path]).quiet is False
    progs[1].finished()
    assert (rank_files.read_pod([tmp_path]).done, rank_files.read_pod([tmp_path]).quiet) == (True, True)
