"""HTTP/1.1 framing for the progress endpoint: httptools parses, one handler answers, in order.

Why not aiohttp.web: the endpoint has three routes and answers a few hundred bytes, yet with
1,024 pods posting aiohttp's request, router and response objects cost more than the
verification and aggregation they carry. Here a connection is an asyncio.Protocol that hands
each complete request to one handler and writes its reply as one buffer; TLS is the standard
library's (tls_accept).
Together with the coalescing loop (coalesce.py) this halved the CPU a post costs.

What it keeps of a real server: keep-alive (HTTP/1.1 by default, 1.0 on request), replies in
request order when a client pipelines, `Expect: 100-continue`, a bound on the request head
(431) and on the body (413: read and dropped up to a cap so the connection survives, closed
beyond it), and `Date` on every reply. Each connection is counted in, and kept to its clocks
by, its server's `Connections` (connections.py: `Limits`).
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools

from muralist_operator.progress.connections import DEFAULT_LIMITS, SWEEP_SECONDS, ConnectionPhase, Connections, Limits
from muralist_operator.progress.tls_accept import LazyTls

log = logging.getLogger("muralist.progress.http")

MAX_HEAD_BYTES = 16 * 1024
# A body over the limit is still read (and dropped) up to this much, so the client gets its 413
# on a connection it can keep; a bigger one is cut off.
MAX_DISCARD_BYTES = 1024 * 1024


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


# One for every server of the process: the value is the same for all.
_DATE = _Clock()

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


class HttpConnection(asyncio.Protocol):
    def __init__(self, handler: Handler, connections: Connections, max_body: int) -> None:
        self._handler = handler
        self._connections = connections
        self._max_body = max_body
        # Made when the HTTP conversation starts, dropped when the socket goes: the parser and
        # this object refer to each other, and a cycle would keep the connection's TLS state
        # (~20 KiB) alive until the garbage collector's next full pass.
        self._parser: httptools.HttpRequestParser | None = None
        self._socket: asyncio.Transport | None = None  # the accepted socket's transport (under TLS)
        self._transport: asyncio.Transport | None = None  # what requests are read from, replies written to
        self._loop = asyncio.get_running_loop()
        self.peer = "?"
        self._pending: collections.deque[tuple[Request, bool]] = collections.deque()
        self.busy = False  # a reply is being awaited: later requests wait in `_pending`
        self.authenticated = False
        self.phase = ConnectionPhase.HANDSHAKE
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
        self.phase, self.since = ConnectionPhase.WAITING, self._connections.now()

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
            self.phase, self.since = ConnectionPhase.READING, self._connections.now()

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
        self.phase = ConnectionPhase.WAITING
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
        transport.write(encode(reply, _DATE.date(), keep_alive, head))
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
            return LazyTls(HttpConnection(handler, connections, max_body), ssl)
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
