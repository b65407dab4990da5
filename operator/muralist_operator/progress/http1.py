"""HTTP/1.1 framing for the progress endpoint: httptools parses, one handler answers, in order.

Why not aiohttp.web: the endpoint has three routes and answers a few hundred bytes, yet with
1,024 pods posting aiohttp's request, router and response objects cost more than the
verification and aggregation they carry. Here a connection is an asyncio.Protocol that hands
each complete request to one handler and writes its reply as one buffer; TLS stays asyncio's.

The loop's selector lingers `coalesce` seconds (50 ms) once a socket is readable, so one
wake-up serves every post that arrived meanwhile: a wake-up of an asyncio loop costs more than
the post it serves, and 300 posts a second otherwise arrive one by one. Both together took the
endpoint from 0.43-0.55 ms of CPU per post to 0.23-0.24 ms (benchmarks/progress_load.py); a post
waits up to 50 ms longer for its answer, which no pod waits for.

What it keeps of a real server: keep-alive (HTTP/1.1 by default, 1.0 on request), replies in
request order when a client pipelines, `Expect: 100-continue`, a bound on the request head
(431) and on the body (413: read and dropped up to a cap so the connection survives, closed
beyond it), and `Date` on every reply.

What one client may hold of it (`Limits`): any pod of the cluster can open connections to the
endpoint, and each one costs memory, so connections are capped and each is on a clock. A TLS
handshake (counted from the accept, before the client's hello: see tls_accept) and every request
(its first byte to its last) must finish within their timeouts. Only a connection that has
carried an authenticated request (an accepted post) may then idle for the keep-alive timeout;
any other is closed when it has been quiet for the request timeout. At the cap, the oldest
connection that has not authenticated (and awaits no reply) is dropped for the new one; when
every open connection has authenticated, the new one is. So a flood of idle or trickling
connections holds at most `max_connections` small sockets for seconds, and pods that post keep
their connections through it.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import email.utils
import enum
import json
import logging
import selectors
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools

from muralist_operator.progress.tls_accept import AwaitHello

log = logging.getLogger("muralist.progress.http")

MAX_HEAD_BYTES = 16 * 1024
# A body over the limit is still read (and dropped) up to this much, so the client gets its 413
# on a connection it can keep; a bigger one is cut off.
MAX_DISCARD_BYTES = 1024 * 1024
COALESCE_SECONDS = 0.05
# How often the clocks of open connections are read (a timeout fires up to this much late).
SWEEP_SECONDS = 1.0
# A sweep later than this was held up by the server itself (a burst of TLS handshakes, a starved
# process): that time is not counted against the clients (see Connections.now).
LATE_SECONDS = 0.25
# Connections the server ended, by reason, are logged at most this often.
CLOSED_LOG_SECONDS = 60.0
# Freed memory is given back to the system once this many connections have closed (~40 KiB each
# over TLS) since the most that were open at once, or, once the closing has stopped, this few: the
# tail of a wave of closes, which would otherwise stay with the process until the next wave.
TRIM_AFTER_CLOSED = 256
TRIM_AFTER_SETTLED = 32


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim; None where the C library has none (musl)."""
    try:
        return cast(Callable[[int], int], ctypes.CDLL(None).malloc_trim)
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


@dataclass(frozen=True)
class Limits:
    """What all clients together may hold of the server. A connection costs ~4 KiB before its
    TLS hello and ~40 KiB after its handshake (benchmarks/progress_flood.py), so the cap bounds a
    flood to tens of MiB (all handshaken: ~160 MiB), and the timeouts to seconds. The defaults
    serve 1,024 posting pods (one kept-alive connection each) with room for four times that."""

    max_connections: int = 4096
    # From the accept to the end of the TLS handshake. A pod takes milliseconds, but 1,024 of
    # them starting at once on a loaded machine took up to 25 s; junk that waits this long holds
    # a few KiB, and at the cap it makes room for newcomers anyway.
    handshake_timeout: float = 30.0
    # A request's first byte to its last (a post is a few hundred bytes); also how long a
    # connection that has not authenticated may stay open between requests.
    request_timeout: float = 30.0
    # Between requests on a connection that carried an accepted post: longer than the longest
    # post interval (aggregate.MAX_POST_INTERVAL_SECONDS), so a pod keeps one connection and
    # one TLS handshake.
    idle_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        for name in ("handshake_timeout", "request_timeout", "idle_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0 seconds, not {getattr(self, name)}")


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # percent-decoded, without the query
    headers: dict[str, str]  # names in lower case
    body: bytes  # empty when `too_large`
    peer: str
    too_large: bool = False  # the body was over the limit and was dropped

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=())
    close: bool = False  # end the connection after this reply
    # The request proved who sent it: its connection may idle for the keep-alive timeout and is
    # not dropped to make room for others (see Limits).
    authenticated: bool = False


# The handler answers at once (the common case, no task) or with an awaitable (a worker thread).
Handler = Callable[[Request], "Reply | Awaitable[Reply]"]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Clock:
    """The `Date` value, formatted once a second, not once a reply."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = email.utils.formatdate(now, usegmt=True).encode()
        return self._value


_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s" % (s.value, s.phrase.encode()) for s in HTTPStatus}


def encode(reply: Reply, date: bytes, keep_alive: bool, head: bool = False) -> bytes:
    """The reply on the wire (a HEAD request's without its body). 204 and 304 carry no
    Content-Length (RFC 9110 8.6)."""
    lines = [_STATUS_LINES[reply.status], b"Date: " + date]
    if reply.status not in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED):
        lines.append(b"Content-Length: %d" % len(reply.body))
    if reply.content_type:
        lines.append(b"Content-Type: " + reply.content_type.encode())
    lines.extend(f"{name}: {value}".encode("latin-1") for name, value in reply.headers)
    if not keep_alive:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + (b"" if head else reply.body)


class Phase(enum.Enum):
    HANDSHAKE = "handshake"  # accepted; TLS not done yet
    WAITING = "waiting"  # between requests
    READING = "reading"  # a request has begun and is not complete


class Connections:
    """The open connections of one server: capped, on their clocks (swept), closed on stop."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: dict[HttpConnection, None] = {}
        # Those that have not authenticated, oldest first: the ones dropped at the cap.
        self.unproven: dict[HttpConnection, None] = {}
        self.seen = 0
        self.high_water = 0  # the most connections open at once since memory was last given back
        self._open_last_sweep = 0
        self.held_up = 0.0  # seconds the server's loop was too busy to serve, in all
        self.closed: collections.Counter[str] = collections.Counter()  # ended by the server, by reason
        self.clock = _Clock()
        self._logged: collections.Counter[str] = collections.Counter()
        self._logged_at = -CLOSED_LOG_SECONDS

    def admit(self, conn: HttpConnection) -> bool:
        """Count a new connection in; at the cap, drop the oldest unproven idle one for it. False:
        every open connection has authenticated (or awaits a reply), the new one is refused."""
        if len(self.open) >= self.limits.max_connections:
            victim = next((c for c in self.unproven if not c.busy), None)
            if victim is None:
                self.closed["over capacity"] += 1
                return False
            victim.abort("dropped for a newer connection at the cap")
        self.open[conn] = None
        self.unproven[conn] = None
        self.seen += 1
        return True

    def proven(self, conn: HttpConnection) -> None:
        self.unproven.pop(conn, None)

    def forget(self, conn: HttpConnection) -> None:
        self.open.pop(conn, None)
        self.unproven.pop(conn, None)

    def now(self) -> float:
        """The connections' clock: monotonic time without the time the loop was held up. 1,024
        pods connecting at once queue their TLS handshakes behind each other: on a loaded machine
        the last waited 15-25 s for the server (benchmarks/progress_load.py), which is not
        theirs to answer for."""
        return time.monotonic() - self.held_up

    def deadline(self, conn: HttpConnection) -> tuple[float, str] | None:
        """When this connection is to be closed, and why; None while a reply is awaited."""
        if conn.busy:
            return None
        limits = self.limits
        if conn.phase is Phase.HANDSHAKE:
            return conn.since + limits.handshake_timeout, "handshake timeout"
        if conn.phase is Phase.READING:
            return conn.since + limits.request_timeout, "request timeout"
        if conn.authenticated:
            return conn.since + limits.idle_timeout, "idle"
        return conn.since + limits.request_timeout, "idle before authenticating"

    def sweep(self, late: float = 0.0) -> None:
        """Close what is past its deadline; `late`: how much later than due this sweep runs."""
        if late > LATE_SECONDS:
            self.held_up += late
        now = self.now()
        for conn in list(self.open):
            due = self.deadline(conn)
            if due is None or now < due[0]:
                continue
            if due[1] == "idle":
                conn.close("idle")  # a pod's kept-alive connection: a graceful goodbye
            else:
                conn.abort(due[1])
        self._give_back()
        self._log(now)

    def _give_back(self) -> None:
        """Hand what closed connections freed back to the system. glibc keeps freed memory for
        reuse (in the middle of its heaps, and in the arena of this server's thread), so without
        this the operator's RSS stays at a flood's peak: 1,000 TLS connections closed left it
        at 100 MiB, malloc_trim took it back to 67 (the 60 MiB it started from, and the
        connections' bookkeeping). A few milliseconds, at most once a sweep, and only after
        many connections closed, or once a wave of closes has stopped (its tail)."""
        now_open = len(self.open)
        self.high_water = max(self.high_water, now_open)
        closed = self.high_water - now_open
        settled = now_open >= self._open_last_sweep
        self._open_last_sweep = now_open
        if _MALLOC_TRIM is not None and (closed >= TRIM_AFTER_CLOSED or (settled and closed >= TRIM_AFTER_SETTLED)):
            _MALLOC_TRIM(0)
            self.high_water = now_open

    def _log(self, now: float) -> None:
        """One line a minute at most when the server ended connections for a limit (not idle
        keep-alives: those are routine)."""
        if now - self._logged_at < CLOSED_LOG_SECONDS:
            return
        new = {k: v - self._logged[k] for k, v in self.closed.items() if k != "idle" and v > self._logged[k]}
        if not new:
            return
        self._logged = collections.Counter(self.closed)
        self._logged_at = now
        log.warning("the progress endpoint closed connections at its limits (%d open, at most %d): %s",
                    len(self.open), self.limits.max_connections,
                    ", ".join(f"{n} {why}" for why, n in sorted(new.items())))

    def close_all(self) -> None:
        for conn in list(self.open):
            conn.close("stopping")


class HttpConnection(asyncio.Protocol):
    def __init__(self, handler: Handler, connections: Connections, max_body: int) -> None:
        self._handler = handler
        self._connections = connections
        self._max_body = max_body
        # Made when the HTTP conversation starts, dropped when the socket goes: the parser and
        # this object refer to each other, and a cycle would keep the connection's TLS state
        # (~40 KiB) alive until the garbage collector's next full pass.
        self._parser: httptools.HttpRequestParser | None = None
        self._socket: asyncio.Transport | None = None  # the accepted socket's transport (under TLS)
        self._transport: asyncio.Transport | None = None  # what requests are read from, replies written to
        self._loop = asyncio.get_running_loop()
        self.peer = "?"
        self._pending: collections.deque[tuple[Request, bool]] = collections.deque()
        self.busy = False  # a reply is being awaited: later requests wait in `_pending`
        self.authenticated = False
        self.phase = Phase.HANDSHAKE
        self.since = self._connections.now()  # when `phase` (or, while waiting, the last reply) began
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._head_size = 0
        self._body_size = 0

    # -- the socket ----------------------------------------------------------------------------

    def accepted(self, transport: asyncio.BaseTransport) -> None:
        """The socket was accepted (under TLS: before the handshake). Counted, or refused at the cap."""
        self._socket = cast(asyncio.Transport, transport)
        self.since = self._connections.now()
        if not self._connections.admit(self):
            self._socket.abort()

    def forget(self) -> None:
        """The socket is gone (or going): let go of everything it held (see `_parser`)."""
        self._connections.forget(self)
        self._pending.clear()
        self._parser = self._socket = self._transport = None

    def abort(self, reason: str) -> None:
        """End it now, without a TLS goodbye: for what broke a limit."""
        self._connections.closed[reason] += 1
        socket = self._socket
        self.forget()
        if socket is not None:
            socket.abort()

    def close(self, reason: str | None = None) -> None:
        if reason is not None:
            self._connections.closed[reason] += 1
        transport = self._transport or self._socket
        if transport is not None and not transport.is_closing():
            transport.close()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Plain HTTP: the socket; under TLS: the handshake is done."""
        if self._socket is None:
            self.accepted(transport)
        if self not in self._connections.open:  # refused at the cap, or dropped during the handshake
            transport.abort()  # type: ignore[attr-defined]
            return
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one without subclassing it
        self._parser = httptools.HttpRequestParser(self)
        peer = self._transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self.phase, self.since = Phase.WAITING, self._connections.now()

    def connection_lost(self, exc: Exception | None) -> None:
        self.forget()

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            refused = e.__context__ if isinstance(e.__context__, _Refused) else None
            if refused is None:
                raise
            self._refuse(refused.status, str(refused))
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not served here")
        except httptools.HttpParserError as e:
            self._refuse(400, f"malformed HTTP request: {e}")

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset()
        if not self.busy:  # a pipelined request waits for its turn on the reply's clock
            self.phase, self.since = Phase.READING, self._connections.now()

    def on_url(self, url: bytes) -> None:
        self._grow_head(len(url))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow_head(len(name) + len(value) + 4)
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            declared = self._headers.get("content-length", "")
            if not (declared.isdigit() and int(declared) > self._max_body):
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._max_body + MAX_DISCARD_BYTES:
            raise _Refused(413, f"the body must be at most {self._max_body} bytes")
        if self._body_size <= self._max_body:
            self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # called from its feed_data
        too_large = self._body_size > self._max_body
        request = Request(
            method=parser.get_method().decode("ascii", "replace"),
            path=unquote(httptools.parse_url(self._url).path.decode("latin-1")),
            headers=self._headers,
            body=b"" if too_large else b"".join(self._body),
            peer=self.peer,
            too_large=too_large,
        )
        keep_alive = parser.should_keep_alive()
        self.phase = Phase.WAITING
        if self.busy:
            self._pending.append((request, keep_alive))
        else:
            self._dispatch(request, keep_alive)

    def _grow_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > MAX_HEAD_BYTES:
            raise _Refused(431, f"the request line and headers must be at most {MAX_HEAD_BYTES} bytes")

    # -- replies ---------------------------------------------------------------------------------

    def _dispatch(self, request: Request, keep_alive: bool) -> None:
        try:
            result = self._handler(request)
        except Exception:
            log.exception("the progress endpoint's handler failed on %s %s", request.method, request.path)
            result = Reply(500, b'{"error": "internal error"}', "application/json")
        head = request.method == "HEAD"
        if isinstance(result, Reply):
            self._write(result, keep_alive, head)
            return
        self.busy = True
        if self._transport is not None:
            self._transport.pause_reading()  # a pipelining client waits; memory stays bounded
        self._loop.create_task(self._await(result, keep_alive, head))

    async def _await(self, pending: Awaitable[Reply], keep_alive: bool, head: bool) -> None:
        try:
            reply = await pending
        except Exception:
            log.exception("the progress endpoint's handler failed")
            reply = Reply(500, b'{"error": "internal error"}', "application/json")
        self.busy = False
        self._write(reply, keep_alive, head)
        while self._pending and not self.busy:
            self._dispatch(*self._pending.popleft())
        if not self.busy and self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def _write(self, reply: Reply, keep_alive: bool, head: bool = False) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        keep_alive = keep_alive and not reply.close
        transport.write(encode(reply, self._connections.clock.date(), keep_alive, head))
        if reply.authenticated and not self.authenticated:
            self.authenticated = True
            self._connections.proven(self)
        self.since = self._connections.now()
        if not keep_alive:
            transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """A request that cannot be parsed or is too big to read: answer and close."""
        body = json.dumps({"error": message}).encode()
        self._write(Reply(status, body, "application/json", close=True), keep_alive=False)


class CoalescingSelector(selectors.DefaultSelector):
    """A selector whose `select` lingers `window` seconds once something is ready, then returns
    everything that became ready meanwhile (one wake-up for a burst)."""

    def __init__(self, window: float = COALESCE_SECONDS) -> None:
        super().__init__()
        self.window = window

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        if not ready or self.window <= 0:
            return ready
        time.sleep(self.window)
        position = {key.fd: i for i, (key, _) in enumerate(ready)}
        for key, events in super().select(0):
            i = position.get(key.fd)
            if i is None:
                ready.append((key, events))
            else:
                ready[i] = (key, ready[i][1] | events)
        return ready


def new_event_loop(coalesce: float = COALESCE_SECONDS) -> asyncio.AbstractEventLoop:
    """An event loop on a CoalescingSelector (a plain one when `coalesce` is 0)."""
    return asyncio.SelectorEventLoop(CoalescingSelector(coalesce))


async def serve(handler: Handler, sock: Any, ssl: Any, max_body: int, limits: Limits = DEFAULT_LIMITS,
                backlog: int = 1024) -> tuple[asyncio.AbstractServer, Connections]:
    """Serve `handler` on a listening socket (TLS when `ssl` is an SSLContext, started once the
    client speaks: see tls_accept); the connections' clocks are read every second or so."""
    loop = asyncio.get_running_loop()
    connections = Connections(limits)
    if ssl is None:
        def factory() -> asyncio.BaseProtocol:
            return HttpConnection(handler, connections, max_body)
    else:
        def factory() -> asyncio.BaseProtocol:
            return AwaitHello(HttpConnection(handler, connections, max_body), ssl, limits.handshake_timeout)
    server = await loop.create_server(factory, sock=sock, backlog=backlog)
    every = min(SWEEP_SECONDS, limits.handshake_timeout / 4, limits.request_timeout / 4, limits.idle_timeout / 4)

    due = loop.time() + every

    def sweep() -> None:
        nonlocal due
        connections.sweep(late=loop.time() - due)
        due = loop.time() + every
        if server.is_serving():
            loop.call_later(every, sweep)

    loop.call_later(every, sweep)
    return server, connections
