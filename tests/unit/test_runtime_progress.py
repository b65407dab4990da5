"""Progress: JSON lines, termination message, ConfigMap patches against a local HTTP server."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from muralist_runtime import progress
from muralist_runtime.progress import ConfigMapReporter, Counts, Progress, kube_target_from_env


class FakeApiServer:
    """Records PATCH requests to a ConfigMap; answers 200 (or 500 when told to)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.fail = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append({"path": self.path, "headers": dict(self.headers),
                                       "body": json.loads(body)})
                self.send_response(500 if outer.fail else 200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def api():
    server = FakeApiServer()
    yield server
    server.close()


def env_for(api: FakeApiServer) -> dict[str, str]:
    return {"MURALIST_PROGRESS_CONFIGMAP": "job-progress", "MURALIST_NAMESPACE": "ns",
            "MURALIST_KUBE_API": api.url, "MURALIST_KUBE_TOKEN": "tok"}


def test_target_needs_configmap_namespace_and_credentials(api: FakeApiServer) -> None:
    assert kube_target_from_env({}) is None
    assert kube_target_from_env({"MURALIST_PROGRESS_CONFIGMAP": "x"}) is None
    # Names set but no API server nor in-cluster token (this machine is no pod).
    assert kube_target_from_env({"MURALIST_PROGRESS_CONFIGMAP": "x",
                                 "MURALIST_NAMESPACE": "ns"}) is None
    target = kube_target_from_env(env_for(api))
    assert target is not None
    assert target.url == f"{api.url}/api/v1/namespaces/ns/configmaps/job-progress"


def test_reporter_patches_throttled_and_final(api: FakeApiServer) -> None:
    target = kube_target_from_env(env_for(api))
    reporter = ConfigMapReporter(target, rank=3, attempt=2, interval=0.5).start()
    prog = Progress(rank=3, total=10, writes=True, local=False, reporter=reporter)
    for i in range(20):  # many images in well under an interval: few patches
        prog.image_done(f"k{i}", "completed" if i % 4 else "skipped", 0.0)
    time.sleep(0.2)
    prog.close()
    assert 2 <= len(api.requests) <= 3, "first heartbeat, maybe one more, then the final one"
    last = api.requests[-1]
    assert last["path"] == "/api/v1/namespaces/ns/configmaps/job-progress"
    assert last["headers"]["Content-Type"] == "application/merge-patch+json"
    assert last["headers"]["Authorization"] == "Bearer tok"
    assert list(last["body"]["data"]) == ["rank-3"]
    value = json.loads(last["body"]["data"]["rank-3"])
    assert {k: value[k] for k in ("attempt", "completed", "skipped", "failed", "total")} == {
        "attempt": 2, "completed": 15, "skipped": 5, "failed": 0, "total": 10}
    assert value["lastImageTime"].endswith("Z") and value["heartbeatTime"].endswith("Z")


def test_reporter_heartbeats_without_images_and_survives_errors(api: FakeApiServer) -> None:
    api.fail = True
    reporter = ConfigMapReporter(kube_target_from_env(env_for(api)), 0, 0, interval=0.1).start()
    # A rank that does not write images (second rank of a CP group): zeros, heartbeat only.
    prog = Progress(rank=1, total=4, writes=False, local=False, reporter=reporter)
    prog.image_done("k", "completed", 0.1)
    time.sleep(0.45)
    prog.close()  # errors are logged, never raised
    assert len(api.requests) >= 3
    value = json.loads(api.requests[-1]["body"]["data"]["rank-0"])
    assert (value["completed"], value["total"], value["lastImageTime"]) == (0, 0, None)


def test_unreachable_api_does_not_block() -> None:
    target = kube_target_from_env({"MURALIST_PROGRESS_CONFIGMAP": "c", "MURALIST_NAMESPACE": "n",
                                   "MURALIST_KUBE_API": "http://127.0.0.1:9",
                                   "MURALIST_KUBE_TOKEN": "t"})
    reporter = ConfigMapReporter(target, 0, 0, interval=10).start()
    start = time.monotonic()
    reporter.update(Counts(completed=1, total=1))
    assert time.monotonic() - start < 0.1
    reporter.close()


def test_progress_lines_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    prog = Progress(rank=2, total=2, writes=True, local=False)
    prog.image_done("00000-000", "skipped", 0.0)
    prog.image_done("00001-000", "completed", 1.23456)
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("MURALIST_PROGRESS ") for line in lines)
    last = json.loads(lines[-1].removeprefix("MURALIST_PROGRESS "))
    assert last == {"event": "completed", "key": "00001-000", "rank": 2, "completed": 1,
                    "skipped": 1, "failed": 0, "total": 2, "seconds": 1.2346}


def test_termination_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "termination-log"
    monkeypatch.setenv("MURALIST_TERMINATION_LOG", str(path))
    text = progress.summary(Counts(1, 2, 0, 5), 78, True, "PermanentFailure",
                            "spec.parallelism.gpusPerNode: " + "x" * 10000)
    assert len(text.encode()) <= 4096
    progress.write_termination(text)
    doc = json.loads(path.read_text())
    assert doc["exitCode"] == 78 and doc["permanent"] is True
    assert doc["message"].startswith("spec.parallelism.gpusPerNode: xxx")
    assert (doc["completed"], doc["skipped"], doc["total"]) == (1, 2, 5)


def _rank_fails(path: str, message_length: int, start: Any) -> None:
    os.environ["MURALIST_TERMINATION_LOG"] = path
    start.wait()
    progress.write_termination(progress.summary(Counts(), 1, False, "Error", "x" * message_length))


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
        progress.write_termination(progress.summary(Counts(), 1, reason == "PermanentFailure", reason, message))
        return json.loads(path.read_text())["message"]

    assert write("Error", "rank 1: collective aborted") == "rank 1: collective aborted"
    assert write("PermanentFailure", "spec.model.dtype: unsupported") == "spec.model.dtype: unsupported"
    assert write("Error", "rank 0: collective aborted") == "spec.model.dtype: unsupported"
    assert write("PermanentFailure", "spec.prompts: too long") == "spec.prompts: too long"


def test_no_termination_log_outside_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MURALIST_TERMINATION_LOG", raising=False)
    monkeypatch.setattr(progress, "TERMINATION_LOG", "/nonexistent/termination-log")
    assert progress.termination_log_path() is None
    progress.write_termination("{}")  # silently nothing


def test_report_carries_last_step_time_advancing_per_step(api: FakeApiServer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(f"2026-01-01T00:00:{s:02d}Z" for s in range(60))
    monkeypatch.setattr(progress, "now_iso", lambda: next(clock))
    reporter = ConfigMapReporter(kube_target_from_env(env_for(api)), 1, 0, interval=60)
    # A non-writing rank (second rank of a CP group): no counts, but its steps are progress.
    prog = Progress(rank=1, total=3, writes=False, local=False, reporter=reporter)
    assert json.loads(reporter.payload()["data"]["rank-1"])["lastStepTime"] is None
    stamps = []
    for _ in range(3):
        prog.step_done()
        stamps.append(json.loads(reporter.payload()["data"]["rank-1"])["lastStepTime"])
    assert stamps == sorted(stamps) and len(set(stamps)) == 3, "advances with every step"
    value = json.loads(reporter.payload()["data"]["rank-1"])
    assert value["lastImageTime"] is None and value["heartbeatTime"] > value["lastStepTime"]
    assert prog.steps == 3


def test_termination_summary_carries_timings() -> None:
    doc = json.loads(progress.summary(Counts(total=1), 0, False, "Completed", "",
                                      {"loadSeconds": 12.34567, "generateSeconds": 3.0}))
    assert (doc["loadSeconds"], doc["generateSeconds"]) == (12.346, 3.0)
