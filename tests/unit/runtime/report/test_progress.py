"""Progress: rank files, the pod's pushed reports (against a local HTTP endpoint), JSON lines,
the whole-job bar and the end-of-pod watchdog."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from muralist_api import contract
from muralist_api.contract import Counts
from muralist_api.contract.progress import ProgressReport
from muralist_runtime.report import progress
from muralist_runtime.report.progress import PodReporter, RankFile, RankProgress, read_counts, target_from_env


class FakeOperator:
    """Records progress posts; answers 204, or what `answer` says; counts connections."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.answer: tuple[int, dict[str, Any] | None] = (204, None)
        self.connections: set[int] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like the operator's progress server

            def do_POST(self) -> None:
                outer.connections.add(id(self.connection))
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                outer.posts.append({"path": self.path, "auth": self.headers["Authorization"], "body": json.loads(raw),
                                    "raw": raw})
                status, doc = outer.answer
                data = json.dumps(doc).encode() if doc is not None else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def operator():
    server = FakeOperator()
    yield server
    server.close()


def pod_env(operator: FakeOperator, token: Path) -> dict[str, str]:
    return {contract.MURALIST_PROGRESS_URL: contract.progress_url(operator.base, "ns", "cats"),
            contract.MURALIST_PROGRESS_TOKEN: str(token), contract.MURALIST_POD_NAME: "cats-1-abcde",
            contract.MURALIST_POD_INDEX: "1", contract.MURALIST_ATTEMPT: "2"}


def test_no_target_outside_a_pod() -> None:
    assert target_from_env({}) is None
    target = target_from_env({contract.MURALIST_PROGRESS_URL: "https://op:8443/v1/x", contract.MURALIST_POD_INDEX: "3"})
    assert target is not None and target.index == 3 and target.token_file == contract.PROGRESS_TOKEN_FILE


def test_the_pod_posts_its_ranks_summed_with_a_fresh_token_each_time(operator: FakeOperator, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    directory = tmp_path / "progress"
    ranks = [RankProgress(rank=r, job_total=10, writes=r != 1, local=False, rank_file=RankFile(directory, r))
             for r in range(3)]  # rank 1: a CP group's second rank, counts nothing
    ranks[0].item_done("a", "completed", 0.1)
    ranks[2].item_done("b", "skipped", 0.0)
    for prog in ranks:
        prog.close()
    reporter = PodReporter(target_from_env(pod_env(operator, token)), directory, interval=60)
    reporter.send()
    token.write_text("rotated\n")  # the kubelet rotates the projected token
    for prog in ranks:
        prog.finished()
    reporter.close()
    assert [p["auth"] for p in operator.posts] == ["Bearer first", "Bearer rotated"]
    assert {p["path"] for p in operator.posts} == {"/v1/namespaces/ns/diffusionjobs/cats/progress"}
    first, last = (p["body"] for p in operator.posts)
    assert {k: first[k] for k in ("pod", "index", "attempt", "ranks", "completed", "skipped", "failed", "total")} == {
        "pod": "cats-1-abcde", "index": 1, "attempt": 2, "ranks": 3, "completed": 1, "skipped": 1, "failed": 0,
        "total": 10}
    assert (first["final"], first["done"], last["final"], last["done"]) == (False, False, True, True)
    assert len(operator.connections) == 1, "one kept-alive connection"


def test_what_the_runtime_posts_is_what_the_operator_reads(operator: FakeOperator, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    directory = tmp_path / "progress"
    ranks = [RankProgress(rank=r, job_total=7, writes=True, local=False, rank_file=RankFile(directory, r))
             for r in range(2)]
    ranks[0].item_done("a", "completed", 0.1)
    ranks[0].step_done()
    ranks[1].item_done("b", "failed", 0.0)
    for prog in ranks:
        prog.finished()
        prog.close()
    reporter = PodReporter(target_from_env(pod_env(operator, token)), directory, interval=60)
    sent = reporter.report(final=True)
    reporter.send(final=True)
    (post,) = operator.posts
    read = ProgressReport.from_wire(post["raw"])  # the operator's parser, on the bytes that went over the wire
    assert read == sent
    assert (read.pod, read.index, read.attempt, read.ranks) == ("cats-1-abcde", 1, 2, 2)
    assert (read.completed, read.skipped, read.failed, read.total) == (1, 0, 1, 7)
    assert read.final and read.finished
    assert read.last_step_time is not None and read.last_image_time is not None
    # The wire's names and shapes are those older operators read: camelCase keys, times to the second in UTC.
    assert list(post["body"]) == ["pod", "index", "attempt", "ranks", "completed", "skipped", "failed", "total",
                                  "lastStepTime", "lastImageTime", "sentAt", "final", "done"]
    assert post["body"]["sentAt"].endswith("Z") and len(post["body"]["sentAt"]) == len("2026-01-01T00:00:00Z")


def test_the_operator_sets_the_interval_and_errors_never_raise(operator: FakeOperator, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    RankProgress(rank=0, job_total=1, writes=True, local=False, rank_file=RankFile(tmp_path / "pod", 0))
    reporter = PodReporter(target_from_env(pod_env(operator, token)), tmp_path / "pod", interval=3)
    operator.answer = (200, {"intervalSeconds": 3.5})  # half seconds (the aggregator's step)
    reporter.send()
    assert reporter.interval == 3.5
    operator.answer = (500, {"error": "x"})
    reporter.send()  # logged, not raised
    operator.close()
    reporter.send()  # unreachable: logged, not raised
    token.unlink()
    reporter.send()  # no token (yet): skipped
    assert reporter.last_status == 500


def test_no_post_before_any_rank_has_started(operator: FakeOperator, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    PodReporter(target_from_env(pod_env(operator, token)), tmp_path / "nothing-yet").send()
    assert operator.posts == [], "the operator would refuse ranks: 0"


def test_an_unreachable_operator_does_not_block(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    env = {contract.MURALIST_PROGRESS_URL: "http://127.0.0.1:9/v1/x", contract.MURALIST_PROGRESS_TOKEN: str(token)}
    reporter = PodReporter(target_from_env(env), tmp_path, interval=10).start()
    start = time.monotonic()
    prog = RankProgress(rank=0, job_total=1, writes=True, local=False, rank_file=RankFile(tmp_path, 0))
    prog.item_done("k", "completed", 0.0)
    assert time.monotonic() - start < 0.1
    reporter.close()


def test_progress_lines_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    prog = RankProgress(rank=2, job_total=2, writes=True, local=False)
    prog.item_done("00000-000", "skipped", 0.0)
    prog.item_done("00001-000", "completed", 1.23456)
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith(contract.PROGRESS_LINE_PREFIX) for line in lines)
    last = json.loads(lines[-1].removeprefix(contract.PROGRESS_LINE_PREFIX))
    assert last == {"event": "completed", "key": "00001-000", "rank": 2, "completed": 1,
                    "skipped": 1, "failed": 0, "total": 2, "seconds": 1.2346}


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
    read = lambda: progress.RankState.parse((tmp_path / "rank-1.json").read_text()).last_step_time  # noqa: E731
    deadline = time.monotonic() + 5
    while read() != stamps[-1] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read() == stamps[-1]


def test_the_pod_waits_for_its_ranks_and_fails_on_a_stalled_one(tmp_path: Path) -> None:
    done = RankProgress(rank=0, job_total=1, writes=True, local=True, rank_file=RankFile(tmp_path, 0))
    done.finished()
    progress.wait_for_pod(tmp_path, timeout=5)  # everyone done: returns at once
    RankProgress(rank=1, job_total=1, writes=True, local=True, rank_file=RankFile(tmp_path, 1))
    old = time.time() - 30
    os.utime(tmp_path / "rank-1.json", (old, old))  # rank 1 has not moved for 30 s
    with pytest.raises(progress.RankStalled, match=r"rank-1 of this pod made no progress for 3[0-9]s"):
        progress.wait_for_pod(tmp_path, timeout=10, poll=0.01)
