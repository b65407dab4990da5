#!/usr/bin/env python3
"""The progress endpoint under a flood of connections: what it costs the operator's memory, and
whether pods' posts are still served.

    ~/.cache/muralist/venv/bin/python benchmarks/progress_flood.py [--connections 2000] [--baseline-rev main]

The server (this tree's, or REV's with `--baseline-rev`, from `git archive`) runs in a process of
its own: the real ProgressServer over TLS with a stub token verifier (any `pod-<i>` token is pod
i of the job). This process then, for each kind of flood, one after the other:

- idle: N TCP connections that never send a byte (no TLS hello);
- trickle: N connections that complete the TLS handshake, then send a request one byte per
  connection per second and never finish it;

holds them for `--hold` seconds once all are open, closes them, and waits `--settle` seconds.
Throughout, one pod posts over a kept-alive connection every 0.2 s. Printed per flood: the
server's RSS (VmRSS) before, at its peak during, and after; how many of the N connections the
server had closed by the end of the hold; the posts made during the flood that were answered
2xx, and the slowest of them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import inspect
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NAMESPACE, JOB = "bench", "flood"
PATH = f"/v1/namespaces/{NAMESPACE}/diffusionjobs/{JOB}/progress"


# -- the server process ------------------------------------------------------------------------


def serve(tree: Path, limits: dict[str, float]) -> int:
    sys.path[:0] = [str(tree / "api"), str(tree / "operator"), str(tree / "runtime")]
    from http import HTTPStatus

    from muralist_operator.progress import auth
    from muralist_operator.progress.auth import Identity
    from muralist_operator.progress.server import ProgressServer
    from muralist_operator.progress.tls import issue, new_ca

    # AuthVerdict since issue 40; a --baseline-rev before that calls it Verdict.
    Verdict = getattr(auth, "AuthVerdict", None) or auth.Verdict

    class Verifier:
        def cached(self, token: str | None) -> bool:
            return True

        def authenticate(self, token: str | None) -> Verdict:
            if token and token.startswith("pod-"):
                return Verdict(HTTPStatus.OK, "ok", Identity(NAMESPACE, "default", f"{JOB}-{token[4:]}", token))
            return Verdict(HTTPStatus.UNAUTHORIZED, "token refused")

        def authorize(self, identity: Identity, namespace: str, job: str, pod: str, index: int) -> Verdict:
            return Verdict(HTTPStatus.OK, "ok", identity)

    ca, ca_key = new_ca()
    tls = issue(["muralist-progress", "127.0.0.1"], ca, ca_key)
    kwargs: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "lookups_block": False}
    if limits:
        from muralist_operator.progress.connections import Limits

        kwargs["limits"] = Limits(**limits)  # type: ignore[arg-type]
    if "limits" in kwargs and "limits" not in inspect.signature(ProgressServer).parameters:
        kwargs.pop("limits")
    server = ProgressServer(Verifier(), lambda namespace, job, report: None, tls, **kwargs).start()
    sys.stdout.write(json.dumps({"port": server.port, "ca": (tls.ca_pem or b"").decode()}) + "\n")
    sys.stdout.flush()
    sys.stdin.read()  # until the orchestrator closes our stdin
    server.stop()
    return 0


# -- the orchestrator --------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Poster:
    """One pod posting every `every` seconds over a kept-alive connection."""

    port: int
    context: ssl.SSLContext
    every: float = 0.2
    log: list[tuple[float, int, float]] = field(default_factory=list)  # (sent at, status or -1, seconds)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        conn: http.client.HTTPSConnection | None = None
        body = json.dumps({"pod": f"{JOB}-0", "index": 0, "attempt": 0, "ranks": 1, "completed": 1, "skipped": 0,
                           "failed": 0, "total": 10, "lastStepTime": None, "lastImageTime": None,
                           "sentAt": "2026-12-01T12:00:00Z", "final": False}).encode()
        headers = {"Authorization": "Bearer pod-0", "Content-Type": "application/json"}
        while not self.stop.wait(self.every):
            started = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.context)
                conn.request("POST", PATH, body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException):
                status = -1
                if conn is not None:
                    conn.close()
                conn = None
            self.log.append((started, status, time.monotonic() - started))
        if conn is not None:
            conn.close()


class Peak:
    """The server's largest RSS while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.value = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.value = max(self.value, rss_mib(self.pid))

    def done(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.value, rss_mib(self.pid))


def open_idle(port: int, n: int) -> list[socket.socket]:
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    for s in socks:
        s.setblocking(False)
    return socks


def open_trickling(port: int, n: int, context: ssl.SSLContext) -> list[socket.socket]:
    def one(_: int) -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
        tls.settimeout(0)
        return tls

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        return list(pool.map(one, range(n)))


def trickle(socks: list[socket.socket], stop: threading.Event) -> None:
    """One byte of a request per connection per second, never the end of it."""
    request = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n".encode() + b"x" * 100000
    sent = 0
    while not stop.wait(1.0):
        for s in socks:
            with contextlib.suppress(OSError, ssl.SSLError):  # closed by the server: that is its defence
                s.send(request[sent:sent + 1])
        sent += 1


def closed_by_server(socks: list[socket.socket]) -> int:
    """How many the server has ended (readable with nothing to read, or reset)."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    closed = 0
    for fd, events in poller.poll(0):
        if events & (select.POLLHUP | select.POLLERR):
            closed += 1
            continue
        try:
            if by_fd[fd].recv(1) == b"":
                closed += 1
        except (ssl.SSLWantReadError, BlockingIOError):
            pass
        except (OSError, ssl.SSLError):
            closed += 1
    return closed


def flood(kind: str, server: subprocess.Popen[str], port: int, context: ssl.SSLContext, poster: Poster,
          args: argparse.Namespace) -> dict[str, Any]:
    before = rss_mib(server.pid)
    peak = Peak(server.pid)
    started = time.monotonic()
    stop = threading.Event()
    if kind == "idle":
        socks = open_idle(port, args.connections)
    else:
        socks = open_trickling(port, args.connections, context)
        threading.Thread(target=trickle, args=(socks, stop), daemon=True).start()
    opened = time.monotonic()
    time.sleep(args.hold)
    closed = closed_by_server(socks)
    stop.set()
    ended = time.monotonic()
    during = peak.done()
    for s in socks:
        s.close()
    time.sleep(args.settle)
    after = rss_mib(server.pid)
    posts = [(status, seconds) for at, status, seconds in poster.log if started <= at <= ended]
    return {"kind": kind, "before": before, "peak": during, "after": after, "closed": closed,
            "open_seconds": opened - started, "posts": len(posts),
            "posts_ok": sum(1 for status, _ in posts if 200 <= status < 300),
            "statuses": Counter(status for status, _ in posts),
            "slowest": max((seconds for _, seconds in posts), default=float("nan"))}


def run_server(tree: Path, args: argparse.Namespace, label: str) -> list[dict[str, Any]]:
    limits = {k: v for k, v in (("max_connections", args.max_connections),
                                ("handshake_timeout", args.handshake_timeout),
                                ("request_timeout", args.request_timeout)) if v is not None}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", str(tree), "--limits", json.dumps(limits)]
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ""})
    try:
        assert server.stdout is not None
        hello = json.loads(server.stdout.readline())
        context = ssl.create_default_context(cadata=hello["ca"])
        poster = Poster(hello["port"], context)
        thread = threading.Thread(target=poster.run, daemon=True)
        thread.start()
        time.sleep(2)  # the poster's handshake and first posts: the warm server
        rows = []
        for kind in args.floods:
            row = flood(kind, server, hello["port"], context, poster, args)
            rows.append({"server": label, **row})
            print(f"{label} {kind}: {json.dumps(row, default=str)}", file=sys.stderr, flush=True)
        poster.stop.set()
        thread.join()
        return rows
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", metavar="TREE", help=argparse.SUPPRESS)
    parser.add_argument("--limits", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--connections", type=int, default=2000, help="connections per flood")
    parser.add_argument("--floods", nargs="+", choices=["idle", "trickle"], default=["idle", "trickle"])
    parser.add_argument("--hold", type=float, default=5.0, help="seconds the flood is held once open")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after closing before RSS is read")
    parser.add_argument("--baseline-rev", metavar="REV", help="also run REV's server first (git archive)")
    parser.add_argument("--max-connections", type=int, default=None, help="this tree's server: Limits")
    parser.add_argument("--handshake-timeout", type=float, default=None)
    parser.add_argument("--request-timeout", type=float, default=None)
    args = parser.parse_args()
    if args.serve:
        return serve(Path(args.serve), json.loads(args.limits))

    rows: list[dict[str, Any]] = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="muralist-flood-") as tmp:
        if args.baseline_rev:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline_rev, "operator", "runtime"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            saved = (args.max_connections, args.handshake_timeout, args.request_timeout)
            args.max_connections = args.handshake_timeout = args.request_timeout = None
            rows += run_server(Path(tmp), args, args.baseline_rev)
            args.max_connections, args.handshake_timeout, args.request_timeout = saved
        given = {"max connections": args.max_connections, "handshake timeout": args.handshake_timeout,
                 "request timeout": args.request_timeout}
        settings = ", ".join(f"{k} {v:g}" for k, v in given.items() if v is not None)
        rows += run_server(REPO, args, f"this tree ({settings})" if settings else "this tree")
    print(f"\n{args.connections} connections per flood, held {args.hold:g} s, RSS read {args.settle:g} s after "
          f"closing; load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print("| server | flood | RSS before (MiB) | RSS peak during | RSS after | closed by the server during the hold "
          "| posts 2xx during the flood | slowest post (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['server']} | {r['kind']} | {r['before']:.0f} | {r['peak']:.0f} | {r['after']:.0f} "
              f"| {r['closed']} of {args.connections} | {r['posts_ok']} of {r['posts']} | {r['slowest']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
