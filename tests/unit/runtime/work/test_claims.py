"""The claim store, with real TCPStores on 127.0.0.1: disjoint claims, restarts, late servers, partitions."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from muralist_runtime.work.claims import ClaimClient, ClaimServer, ClaimStoreUnavailable

from tests.operator_helpers import free_port

pytest.importorskip("torch.distributed")

HOST = "127.0.0.1"
ENV = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}


class Retries:
    """A ClaimClient `sleep` that records each back-off and lets a test wait for the n-th one."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._changed = threading.Condition()

    def __call__(self, seconds: float) -> None:
        with self._changed:
            self.delays.append(seconds)
            self._changed.notify_all()
        time.sleep(min(seconds, 0.05))

    def wait_for(self, n: int, timeout_s: float = 20.0) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.delays) >= n, timeout_s), f"{len(self.delays)} retries"


def in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run fn in a thread now; the returned function joins it and returns its result (or raises)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result(timeout_s: float = 30.0) -> Any:
        thread.join(timeout_s)
        assert not thread.is_alive(), "still blocked"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return result


def test_clients_in_threads_claim_every_chunk_exactly_once() -> None:
    n = 400
    with ClaimServer(0) as server:
        clients = [ClaimClient(HOST, server.port, "job-a") for _ in range(3)]

        def claim_all(client: ClaimClient) -> list[int]:
            got = []
            while (chunk := client.next_chunk()) < n:
                got.append(chunk)
            return got

        results = [in_thread(lambda c=c: claim_all(c)) for c in clients]
        claimed = [r() for r in results]
    assert sorted(c for got in claimed for c in got) == list(range(n))
    assert all(c == sorted(c) for c in claimed), "each client's chunks only increase"
    for c in clients:
        c.close()


def test_a_client_in_another_process_shares_the_counter() -> None:
    n = 2000
    with ClaimServer(0) as server:
        # The other process says when it has its first chunk (torch takes seconds to import).
        code = (f"import json; from muralist_runtime.work.claims import ClaimClient; c = ClaimClient({HOST!r}, "
                f"{server.port}, 'procs'); got = [c.next_chunk()]; print(flush=True)\n"
                f"while (k := c.next_chunk()) < {n}: got.append(k)\nprint(json.dumps(got))")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=ENV, text=True)
        assert proc.stdout.readline() == "\n"
        here, client = [], ClaimClient(HOST, server.port, "procs")
        while (k := client.next_chunk()) < n:
            here.append(k)
        there = json.loads(proc.communicate(timeout=60)[0])
    assert proc.returncode == 0
    assert there[0] == 0
    assert sorted(here + there) == list(range(n))


def test_namespaces_are_separate_counters() -> None:
    with ClaimServer(0) as server, ClaimClient(HOST, server.port, "attempt-0") as a, \
            ClaimClient(HOST, server.port, "attempt-1") as b:
        assert [a.next_chunk(), a.next_chunk(), b.next_chunk(), a.next_chunk()] == [0, 1, 0, 2]
    with pytest.raises(ValueError, match="without '/'"):
        ClaimClient(HOST, 1234, "a/b")


def test_a_killed_server_restarted_on_its_port_is_claimed_from_zero(caplog: pytest.LogCaptureFixture) -> None:
    code = ("import sys; from muralist_runtime.work.claims import ClaimServer; s = ClaimServer(0)\n"
            "print(s.port, flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV,
                            text=True)
    try:
        port = int(proc.stdout.readline())
        retries = Retries()
        client = ClaimClient(HOST, port, "job", connect_timeout_s=0.5, sleep=retries)
        assert [client.next_chunk() for _ in range(3)] == [0, 1, 2]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        with caplog.at_level(logging.INFO, logger="muralist.claims"):
            claim = in_thread(client.next_chunk)
            retries.wait_for(3)  # the client keeps retrying while nothing listens
            with ClaimServer(port):
                assert claim() == 0, "a restarted host's counter starts again at 0, by design"
                assert client.next_chunk() == 1
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, "one warning per outage, not one per retry"
        assert f"{HOST}:{port} unreachable" in warnings[0].getMessage()
        assert any("reachable again" in r.getMessage() for r in caplog.records)
        assert client.reconnects == 1
        assert retries.delays[:3] == [0.1, 0.2, 0.4], "exponential back-off"
    finally:
        proc.kill()
        proc.wait()


def test_a_connection_given_up_on_is_not_counted_when_it_comes_late(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under load a connection attempt can outlive the client's wait for it: the client moves on
    # to a new attempt, and the abandoned one may still succeed later. CI saw it counted as a
    # second reconnect.
    import torch.distributed as dist

    release, made = threading.Event(), []

    class SlowThenFast:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            if len(made) == 1:
                release.wait(30)  # longer than the client waits for a connection

        def add(self, key: str, amount: int) -> int:
            return 1

    monkeypatch.setattr(dist, "TCPStore", SlowThenFast)
    before = set(threading.enumerate())
    client = ClaimClient(HOST, 1234, "job", connect_timeout_s=0.01, sleep=lambda s: None)
    assert client.next_chunk() == 0  # from the second attempt's store
    release.set()  # the first attempt now succeeds, too late
    client.close()
    for thread in set(threading.enumerate()) - before:
        thread.join(5)
    assert len(made) == 2
    assert client.reconnects == 0


def test_a_client_started_before_the_server_waits_for_it() -> None:
    port = free_port()
    retries = Retries()
    client = ClaimClient(HOST, port, "early", connect_timeout_s=0.3, sleep=retries)
    claim = in_thread(client.next_chunk)
    retries.wait_for(1)
    with ClaimServer(port):
        assert claim() == 0
        assert client.reconnects == 0, "the first connection is not a reconnect"


def test_a_probe_of_a_closed_port_ends_at_its_bound_and_a_listening_store_answers_at_once() -> None:
    port = free_port()
    probe = ClaimClient(HOST, port, "probe")
    start = time.monotonic()
    assert not probe.reachable(1.0)
    # A TCPStore's own connect overshot its timeout by its back-off (15 s took 34 s).
    assert time.monotonic() - start < 1.5
    with ClaimServer(port):
        start = time.monotonic()
        assert probe.reachable(10.0)
        assert time.monotonic() - start < 1.0
        with ClaimClient(HOST, port, "probe") as client:
            assert client.next_chunk() == 0, "the probe's bare connection leaves the store serving"


def test_a_bounded_client_gives_up_with_a_useful_error() -> None:
    client = ClaimClient(HOST, free_port(), "nobody", connect_timeout_s=0.2, give_up_after_s=0.5,
                         sleep=lambda s: time.sleep(0.05))
    start = time.monotonic()
    with pytest.raises(ClaimStoreUnavailable, match=r"unreachable for \d+ s: is the first pod running"):
        client.next_chunk()
    assert time.monotonic() - start < 15


def test_by_default_an_outage_ends_in_a_failure_that_names_the_store() -> None:
    # A store that never comes back: the default client waits OUTAGE_SECONDS (on a clock that
    # each back-off moves on by 5 minutes), then fails, instead of waiting for good.
    from muralist_runtime.work.claims import OUTAGE_SECONDS

    class Forever(Exception):
        pass

    now, attempts = [0.0], []

    def after_attempt() -> None:
        attempts.append(now[0])
        if len(attempts) > 20:
            raise Forever

    port = free_port()
    client = ClaimClient(HOST, port, "nobody", connect_timeout_s=0.05, on_outage=after_attempt,
                         sleep=lambda s: now.__setitem__(0, now[0] + 300), clock=lambda: now[0])
    with pytest.raises(ClaimStoreUnavailable, match=rf"claim store {HOST}:{port} unreachable for 900 s"):
        client.next_chunk()
    assert OUTAGE_SECONDS == 900 and attempts == [0, 300, 600]


def test_an_outage_hook_may_stop_the_waiting() -> None:
    class Finished(Exception):
        pass

    calls = []

    def finished() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise Finished

    client = ClaimClient(HOST, free_port(), "nobody", connect_timeout_s=0.2, sleep=lambda s: None, on_outage=finished)
    with pytest.raises(Finished):  # retry_forever would otherwise wait for good
        client.next_chunk()
    assert len(calls) == 3


class BlackholeProxy:
    """Forwards TCP to a port; while `blackhole` is set it swallows bytes and closes nothing:
    a network partition as the client sees it (no RST, no FIN)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.blackhole = False
        self.listener = socket.create_server((HOST, 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection((HOST, self.target_port))
            threading.Thread(target=self._pump, args=(down, up), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        with a, b:
            while True:
                ready, _, _ = select.select([a, b], [], [], 0.05)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if not self.blackhole:
                        (b if s is a else a).sendall(data)

    def close(self) -> None:
        self.listener.close()


def test_a_claim_on_a_partitioned_connection_times_out_and_reconnects() -> None:
    # TCPStore.add has no timeout of its own: without the client's worker thread this claim
    # would block until the kernel gave up on the socket (~15 min).
    with ClaimServer(0) as server:
        proxy = BlackholeProxy(server.port)
        retries = Retries()
        client = ClaimClient(HOST, proxy.port, "p", connect_timeout_s=0.5, op_timeout_s=0.5, sleep=retries)
        assert client.next_chunk() == 0
        proxy.blackhole = True
        start = time.monotonic()
        claim = in_thread(client.next_chunk)
        retries.wait_for(1)
        assert time.monotonic() - start < 5, "the stuck add was abandoned after op_timeout_s"
        proxy.blackhole = False
        assert claim() == 1, "the swallowed request never reached the server"
        assert client.reconnects >= 1
        proxy.close()
        client.close()
