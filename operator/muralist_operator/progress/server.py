"""The HTTPS endpoint pods post progress to, on its own thread and event loop.

Not on kopf's loop: a burst of 1,000 posts (or a slow TokenReview) must not delay watch
events, and kopf's loop must not delay the posts. HTTP is framed by http1 (httptools), whose
connections are capped and each put on a clock (connections.Limits: any pod of the cluster can
connect), and TLS starts only once a client speaks (tls_accept). A post whose token is cached
is checked on the loop (memory only); a TokenReview (and a pod lookup that may block) runs on
a small thread pool, and the loop goes on meanwhile.

    POST /v1/namespaces/{namespace}/diffusionjobs/{job}/progress   (the progress wire:
         muralist_api.contract.progress, its PROGRESS_PATH and its body, ProgressReport)
      204  accepted: keep posting at the default interval (DEFAULT_POST_INTERVAL_SECONDS)
      200  accepted, {"intervalSeconds": N}: post every N seconds from now on (backpressure; N
           is a multiple of 0.5)
      400  malformed body: {"error": "..."} names the field
      401  no token, a refused token, another audience, or the token's pod is gone
      403  a valid token of a pod that is not that job's pod (or not the pod the body names)
      404  unknown job
      413  body over the limit
      503  not the active replica (Retry-After), or the API server could not be asked
    GET /readyz   200 on the active replica, 503 on a standby: a readiness probe on it keeps the
                  progress Service's endpoints on the replica that reconciles
    GET /healthz  200 while the loop runs

The response says the interval every time (204 = the default), so a pod follows the latest
answer and no state about what a pod was told is kept here. A refused post is handed to
`on_refusal` too (all but 404 and a standby's 503): the last error the endpoint saw for a job
is what status says when its posts stop (policies/stall.py, ProgressUnreachable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, Protocol

from muralist_api.contract.progress import (
    DEFAULT_POST_INTERVAL_SECONDS,
    PROGRESS_PATH,
    ProgressReport,
    parse_progress_path,
)

from muralist_operator.progress import http1
from muralist_operator.progress.auth import AuthVerdict, Identity
from muralist_operator.progress.coalesce import COALESCE_SECONDS, new_event_loop
from muralist_operator.progress.connections import DEFAULT_LIMITS, Connections, Limits
from muralist_operator.progress.tls import TlsMaterial, server_context

log = logging.getLogger("muralist.progress.server")

MAX_BODY_BYTES = 16 * 1024
REFUSAL_LOG_WINDOW_SECONDS = 60.0

OnReport = Callable[[str, str, ProgressReport], None]
OnRefusal = Callable[[str, str, int, str], None]  # (namespace, job, status, reason)


class Verifier(Protocol):
    """auth.TokenVerifier, or a stub in tests."""

    def cached(self, token: str | None) -> bool:
        """True when `authenticate` would answer from memory (no TokenReview)."""
        ...

    def authenticate(self, token: str | None) -> AuthVerdict: ...

    def authorize(self, identity: Identity, namespace: str, job: str, pod: str, index: int) -> AuthVerdict: ...


class RefusalLog:
    """One line per (status, namespace, job) per window, with how many were held back since the
    last: a misconfigured job of 1,000 pods must not write 300 lines a second."""

    def __init__(self, window: float = REFUSAL_LOG_WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10_000) -> None:
        self.window = window
        self._clock = clock
        self.max_keys = max_keys
        self._last: dict[tuple[int, str, str], tuple[float, int]] = {}

    def refused(self, status: int, namespace: str, job: str, reason: str, peer: str, exc_info: bool = False) -> bool:
        """Log the refusal unless one like it was logged within the window; True when logged.
        `exc_info`: our own failure (5xx), so the logged line carries the traceback."""
        now = self._clock()
        key = (status, namespace, job)
        last = self._last.get(key)
        if last is not None and now - last[0] < self.window:
            self._last[key] = (last[0], last[1] + 1)
            return False
        held = f" ({last[1]} more like it held back)" if last and last[1] else ""
        log.warning("refused a progress post for %s/%s from %s: %d %s%s", namespace, job, peer, status, reason, held,
                    exc_info=exc_info)
        if len(self._last) >= self.max_keys:
            self._last.clear()
        self._last[key] = (now, 0)
        return True


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> http1.Reply:
    return http1.Reply(status, json.dumps({"error": message}).encode(), "application/json", headers)


# An accepted post: the pod's connection may stay open between posts (connections.Limits).
_NO_CONTENT = http1.Reply(204, authenticated=True)
_RETRY = (("Retry-After", "5"),)


class ProgressServer:
    def __init__(
        self,
        verifier: Verifier,
        on_report: OnReport,
        tls: TlsMaterial | None,
        *,
        host: str = "0.0.0.0",
        port: int = 8443,
        is_active: Callable[[], bool] = lambda: True,
        job_exists: Callable[[str, str], bool] | None = None,
        interval: Callable[[str, str], float] | None = None,
        max_body: int = MAX_BODY_BYTES,
        limits: Limits = DEFAULT_LIMITS,
        workers: int = 4,
        refusals: RefusalLog | None = None,
        lookups_block: bool = True,
        coalesce: float = COALESCE_SECONDS,
        on_refusal: OnRefusal | None = None,
    ) -> None:
        """`tls=None` serves plain HTTP (behind a mesh that terminates TLS; tests). `on_report`
        runs on the server's loop thread: keep it quick and thread-safe (the aggregator's
        `record` plus a wake-up of the reconciler). `job_exists` and `interval`: None means
        every job exists and the default interval always holds.

        Verification runs on worker threads, since a TokenReview (and, in tests, a pod lookup
        over the API) blocks. `lookups_block=False` says that the pod lookup, `job_exists` and
        `interval` only read memory (the operator's kopf indexes): a post whose token is cached
        is then checked on the loop itself, which saves the thread hop (~20 % of the server's
        CPU at 350 posts/s, benchmarks/progress_load.py). `coalesce`: how long the loop lingers
        after a wake-up to serve more posts with it (see coalesce; 0: not at all). `limits`: what
        all clients together may hold (connections, handshake, request and idle timeouts: see
        connections.Limits); an accepted post is what lets a connection stay for the idle timeout.
        `on_refusal`: told of each refused post (on the loop thread, like `on_report`)."""
        self._verifier = verifier
        self._on_report = on_report
        self._on_refusal = on_refusal
        self._ssl = server_context(tls) if tls is not None else None
        self.host, self.port = host, port
        self._is_active = is_active
        self._job_exists = job_exists
        self._interval = interval
        self._max_body = max_body
        self.limits = limits
        self._workers = workers
        self._refusals = refusals or RefusalLog()
        self._lookups_block = lookups_block
        self._coalesce = coalesce
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._server: asyncio.AbstractServer | None = None
        self._http: Connections | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        # What the operator's metrics can export: responses by status (and `connections_seen`).
        self.responses: Counter[int] = Counter()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ProgressServer:
        """Listen (port 0: any free port, then `self.port` says which) and serve until `stop`."""
        sock = socket.create_server((self.host, self.port), backlog=1024)
        self.port = sock.getsockname()[1]
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="muralist-progress-verify")
        self._thread = threading.Thread(target=self._run, args=(sock,), name="muralist-progress-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError(f"the progress server did not start within {timeout}s")
        if self._start_error is not None:
            raise RuntimeError(f"the progress server did not start: {self._start_error}") from self._start_error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop = self._thread = self._pool = None

    def update_tls(self, material: TlsMaterial) -> None:
        """Serve a renewed certificate to new connections (on the loop thread: OpenSSL contexts
        are not to be changed while a handshake reads them)."""
        if self._ssl is None:
            raise RuntimeError("this server was started without TLS")
        if self._loop is None:
            server_context(material, self._ssl)
            return
        asyncio.run_coroutine_threadsafe(self._reload(material), self._loop).result(timeout=10)

    async def _reload(self, material: TlsMaterial) -> None:
        assert self._ssl is not None
        server_context(material, self._ssl)

    def _run(self, sock: socket.socket) -> None:
        loop = new_event_loop(self._coalesce)
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            server, connections = loop.run_until_complete(
                http1.serve(self._route, sock, self._ssl, self._max_body, self.limits))
        except BaseException as e:  # reported by start()
            self._start_error = e
            self._started.set()
            loop.close()
            sock.close()
            return
        self._server, self._http = server, connections
        self._started.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            connections.close_all()
            loop.run_until_complete(server.wait_closed())
            loop.run_until_complete(asyncio.sleep(0))  # let the transports finish closing
            loop.close()

    # -- handlers ----------------------------------------------------------------------------

    def _route(self, request: http1.Request) -> http1.Reply | Awaitable[http1.Reply]:
        if request.path in ("/readyz", "/healthz"):
            if request.method not in ("GET", "HEAD"):
                return _error(405, "use GET", (("Allow", "GET, HEAD"),))
            if request.path == "/healthz":
                return http1.Reply(200, b"ok\n", "text/plain")
            if self._is_active():
                return http1.Reply(200, b"active\n", "text/plain")
            return http1.Reply(503, b"standby: another replica reconciles\n", "text/plain")
        target = parse_progress_path(request.path)
        if target is None:
            return _error(404, f"no such route: {request.path}; pods post to {PROGRESS_PATH}")
        if request.method != "POST":
            return _error(405, "use POST", (("Allow", "POST"),))
        return self._progress(request, *target)

    def _progress(self, request: http1.Request, namespace: str, job: str) -> http1.Reply | Awaitable[http1.Reply]:
        peer = request.peer
        if not self._is_active():
            return self._refused(503, namespace, job, "not the active replica", peer, note=False)
        if request.too_large:
            return self._refused(413, namespace, job, "body too large", peer,
                                 message=f"the body must be at most {self._max_body} bytes")
        token = _bearer(request.headers.get("authorization"))
        check = (token, namespace, job, request.content_type, request.body)
        if not self._lookups_block and self._verifier.cached(token):
            try:
                outcome = self._check(*check)
            except Exception as e:
                return self._cannot_verify(e, namespace, job, peer)
            return self._answer(outcome, namespace, job, peer)
        return self._answer_later(check, namespace, job, peer)

    async def _answer_later(self, check: tuple[Any, ...], namespace: str, job: str, peer: str) -> http1.Reply:
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(self._pool, self._check, *check)
        except Exception as e:
            return self._cannot_verify(e, namespace, job, peer)
        return self._answer(outcome, namespace, job, peer)

    def _cannot_verify(self, e: Exception, namespace: str, job: str, peer: str) -> http1.Reply:
        # A pod lookup or the API server failing: the pod retries later.
        self._refusals.refused(503, namespace, job, f"cannot verify now: {e!r}", peer, exc_info=True)
        self._note(503, namespace, job, f"cannot verify now: {type(e).__name__}")
        return self._counted(_error(503, f"cannot verify now: {type(e).__name__}", _RETRY))

    def _answer(self, outcome: tuple[int, str, ProgressReport | None, float], namespace: str, job: str,
                peer: str) -> http1.Reply:
        status, message, report, interval = outcome
        if report is None:
            return self._refused(status, namespace, job, message, peer)
        try:
            self._on_report(namespace, job, report)
        except Exception as e:
            self._refusals.refused(500, namespace, job, f"handling the report of pod {report.pod} failed: {e!r}", peer,
                                   exc_info=True)
            self._note(500, namespace, job, "the operator could not take the report")
            return self._counted(_error(500, "the operator could not take the report"))
        if interval == DEFAULT_POST_INTERVAL_SECONDS:
            return self._counted(_NO_CONTENT)
        return self._counted(http1.Reply(200, json.dumps({"intervalSeconds": interval}).encode(), "application/json",
                                         authenticated=True))

    def _refused(self, status: int, namespace: str, job: str, reason: str, peer: str,
                 message: str | None = None, note: bool = True) -> http1.Reply:
        self._refusals.refused(status, namespace, job, reason, peer)
        if note:
            self._note(status, namespace, job, message or reason)
        return self._counted(_error(status, message or reason, _RETRY if status == 503 else ()))

    def _note(self, status: int, namespace: str, job: str, reason: str) -> None:
        """Tell `on_refusal`; an unknown job's 404 is nobody's error."""
        if self._on_refusal is None or status == 404:
            return
        try:
            self._on_refusal(namespace, job, status, reason)
        except Exception:
            log.exception("noting a refused post for %s/%s failed", namespace, job)

    def _counted(self, reply: http1.Reply) -> http1.Reply:
        self.responses[reply.status] += 1
        return reply

    @property
    def connections_seen(self) -> int:
        return self._http.seen if self._http is not None else 0

    @property
    def connections_closed(self) -> dict[str, int]:
        """Connections the server ended, by reason (a limit of connections.Limits, or "idle")."""
        return dict(self._http.closed) if self._http is not None else {}

    def _check(
        self, token: str | None, namespace: str, job: str, content_type: str, body: bytes
    ) -> tuple[int, str, ProgressReport | None, float]:
        """On a worker thread (or the loop, see `lookups_block`): (status, message, the report when
        accepted, the interval to tell).
        401 before 404 before 400 before 403: nothing about jobs or the body is said to a caller
        that has not shown a valid token."""
        verdict = self._verifier.authenticate(token)
        if not verdict.ok or verdict.identity is None:
            return verdict.status, verdict.reason, None, 0
        if self._job_exists is not None and not self._job_exists(namespace, job):
            return 404, f"no diffusionjob {namespace}/{job}", None, 0
        if content_type != "application/json":
            return 400, f"Content-Type must be application/json, not {content_type or 'none'}", None, 0
        try:
            report = ProgressReport.from_wire(body)
        except ValueError as e:  # ReportError: names the field (or says the body is not JSON)
            return 400, str(e), None, 0
        verdict = self._verifier.authorize(verdict.identity, namespace, job, report.pod, report.index)
        if not verdict.ok:
            return verdict.status, verdict.reason, None, 0
        interval = self._interval(namespace, job) if self._interval is not None else DEFAULT_POST_INTERVAL_SECONDS
        return HTTPStatus.OK, "", report, interval

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """What a pod (or a test) trusts: exactly this CA."""
    return ssl.create_default_context(cadata=ca_pem.decode())
