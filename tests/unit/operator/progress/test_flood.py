"""The progress endpoint under a flood of connections, on loopback: the server (real TLS, a stub
verifier) runs in a process of its own so that its RSS is its own."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PATH = "/v1/namespaces/team-a/diffusionjobs/cats/progress"
MIB = 1024 * 1024

# The flood's timeouts are long so that it is held while it is measured, however slow the
# machine: the memory bound must hold whatever the timeouts (they are tested in test_progress_http1).
SERVER = """
import json, sys
from http import HTTPStatus
from muralist_operator.progress.auth import Identity, AuthVerdict
from muralist_operator.progress.connections import Limits
from muralist_operator.progress.server import ProgressServer
from muralist_operator.progress.tls import issue, new_ca

class Verifier:
    def cached(self, token):
        return True
    def authenticate(self, token):
        if token == "cats-0":
            return AuthVerdict(HTTPStatus.OK, "ok", Identity("team-a", "default", "cats-0", "uid-0"))
        return AuthVerdict(HTTPStatus.UNAUTHORIZED, "token refused")
    def authorize(self, identity, namespace, job, pod, index):
        return AuthVerdict(HTTPStatus.OK, "ok", identity)

ca, key = new_ca()
server = ProgressServer(Verifier(), lambda *report: None, issue(["127.0.0.1"], ca, key), host="127.0.0.1", port=0,
                        lookups_block=False, coalesce=0.005, limits=Limits(handshake_timeout=120, request_timeout=120))
server.start()
print(json.dumps({"port": server.port, "ca": ca.decode()}), flush=True)
sys.stdin.read()
"""

BODY = json.dumps({"pod": "cats-0", "index": 0, "attempt": 0, "ranks": 1, "completed": 1, "skipped": 0, "failed": 0,
                   "total": 10, "lastStepTime": None, "lastImageTime": None, "sentAt": "2026-12-01T12:00:00Z",
                   "final": False}).encode()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"process {pid} is gone")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up after {timeout:.0f} s waiting for {what}"
        time.sleep(0.05)


@dataclass
class Poster:
    """A pod posting every 50 ms over a kept-alive connection, and over a new one every 5th post."""

    port: int
    context: ssl.SSLContext
    log: list[tuple[float, int]] = field(default_factory=list)  # (sent at, status; -1: no answer)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        conn: http.client.HTTPSConnection | None = None
        while not self.stop.wait(0.05):
            if conn is not None and len(self.log) % 5 == 0:
                conn.close()
                conn = None
            sent = time.monotonic()
            try:
                conn = conn or http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.context)
                conn.request("POST", PATH, body=BODY, headers={"Authorization": "Bearer cats-0",
                                                               "Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                status, conn = -1, None
            self.log.append((sent, status))
        if conn is not None:
            conn.close()

    def served(self, since: float = 0.0) -> int:
        return sum(1 for sent, status in self.log if sent >= since and 200 <= status < 300)


@pytest.fixture
def server() -> Iterator[tuple[subprocess.Popen[str], dict[str, object]]]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc, json.loads(proc.stdout.readline())
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_flood_of_connections_costs_little_memory_gives_it_back_and_posts_are_served(
        server: tuple[subprocess.Popen[str], dict[str, object]]) -> None:
    """2,000 connections that never send a request, three quarters never even a TLS hello (the
    rest complete the handshake and leave a request unfinished), against the 64 MiB bound: on
    asyncio's own TLS each cost ~300 KiB (600 MiB in all), kept after they closed.

    Memory back: within 16 MiB of where it started. What stays is kept for reuse, not held by
    the closed connections: tables that grew with the flood (the selector's, the loop's
    transports), Python's partly used object arenas; ~7 MiB after 2,000 connections on this
    machine, and a second flood reuses it (benchmarks/progress_flood.py). Without giving freed
    memory back, the handshaken quarter alone keeps ~20 MiB."""
    proc, hello = server
    idle, handshaken = 1500, 500
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = idle + handshaken + 256
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))  # this process's; the server has its own
    context = ssl.create_default_context(cadata=str(hello["ca"]))
    port = int(str(hello["port"]))
    poster = Poster(port, context)
    thread = threading.Thread(target=poster.run, daemon=True)
    thread.start()
    socks: list[socket.socket] = []
    try:
        wait_for(lambda: poster.served() >= 5, "the first posts")
        before = rss(proc.pid)
        flood_started = time.monotonic()

        socks += [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(idle)]

        def unfinished(_: int) -> socket.socket:
            tls = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                                      server_hostname="127.0.0.1")
            tls.sendall(f"POST {PATH} HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{{".encode())
            return tls

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            socks += pool.map(unfinished, range(handshaken))
        wait_for(lambda: open_files(proc.pid) >= idle + handshaken, "the server to hold every connection")
        served = poster.served(flood_started)
        wait_for(lambda: poster.served(flood_started) >= served + 5, "posts while the flood is held")
        during = rss(proc.pid)
        flood_ended = time.monotonic()
        assert during - before <= 64 * MIB, f"{(during - before) / MIB:.0f} MiB for {len(socks)} connections"
        posts = [status for sent, status in poster.log if flood_started <= sent <= flood_ended]
        assert len(posts) >= 5 and all(200 <= status < 300 for status in posts), posts

        for s in socks:
            s.close()
        socks.clear()
        wait_for(lambda: open_files(proc.pid) < 64, "the server to see the connections closed")
        try:
            wait_for(lambda: rss(proc.pid) - before <= 16 * MIB, "the memory back", timeout=10)
        except AssertionError:
            pytest.fail(f"RSS {before / MIB:.0f} MiB before, {during / MIB:.0f} during, "
                        f"{rss(proc.pid) / MIB:.0f} after the connections closed")
        assert poster.log[-1][1] in (200, 204)
    finally:
        for s in socks:
            s.close()
        poster.stop.set()
        thread.join(15)
