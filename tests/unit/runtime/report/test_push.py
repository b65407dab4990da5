"""The pod's pushed reports, against a local HTTP endpoint: what is posted, how often, with which
token, and that a missing or failing operator never holds generation up."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from muralist_api import contract
from muralist_api.contract.progress import ProgressReport
from muralist_runtime.report.progress import RankProgress
from muralist_runtime.report.push import PodReporter, target_from_env
from muralist_runtime.report.rank_files import RankFile


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
                                  "rerendered", "lastStepTime", "lastImageTime", "sentAt", "final", "done"]
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
