"""Progress: JSON lines, rank files and the whole-job bar, ConfigMap patches against a local HTTP server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from muralist_runtime import progress
from muralist_runtime.progress import ConfigMapReporter, Progress, RankFile, kube_target_from_env, read_counts
from muralist_runtime.spec.contract import Counts


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


def test_rank_files_of_all_pods_sum_to_the_whole_job(tmp_path: Path) -> None:
    # Two agents ("pods") of two ranks each; rank 3 is a CP group's second rank (writes nothing).
    pods = [tmp_path / "pod-0", tmp_path / "pod-1"]
    progs = [Progress(rank=r, total=4, writes=r != 3, local=True, rank_file=RankFile(pods[r // 2], r, interval=60))
             for r in range(4)]
    for r, prog in enumerate(progs):
        for i in range(r + 1 if r != 3 else 0):
            prog.image_done(f"{r}-{i}", "skipped" if i == 0 else "completed", 0.0)
    assert read_counts(pods) == Counts(completed=0, skipped=0, failed=0, total=12), "throttled: only the first write"
    for prog in progs:
        prog.close()
    assert read_counts(pods) == Counts(completed=3, skipped=3, failed=0, total=12)
    (pods[0] / "rank-9.json").write_text("{not json")  # a torn write is skipped, not fatal
    assert read_counts(pods).total == 12


def test_local_bar_counts_every_rank_of_every_agent(tmp_path: Path) -> None:
    from muralist_runtime.local import JobBar

    pods = [tmp_path / "pod-0", tmp_path / "pod-1"]
    for r in range(2):
        prog = Progress(rank=r, total=8, writes=True, local=True, rank_file=RankFile(pods[r], r))
        for i in range(8):
            prog.image_done(str(i), "completed", 0.0)
        prog.close()
    with JobBar(pods, total=16) as bar:
        bar.refresh()
        assert (bar.bar.n, bar.bar.total) == (16, 16), "the whole job, not rank 0's share"
