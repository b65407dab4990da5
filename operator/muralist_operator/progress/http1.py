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
beyond it), idle connections closed after `keepalive_timeout`, and `Date` on every reply.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
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

log = logging.getLogger("muralist.progress.http")

MAX_HEAD_BYTES = 16 * 1024
# A body over the limit is still read (and dropped) up to this much, so the client gets its 413
# on a connection it can keep; a bigger one is cut off.
MAX_DISCARD_BYTES = 1024 * 1024
IDLE_SWEEP_SECONDS = 5.0
COALESCE_SECONDS = 0.05


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


class Connections:
    """The open connections of one server: counted, swept when idle, closed on stop."""

    def __init__(self, keepalive_timeout: float) -> None:
        self.keepalive_timeout = keepalive_timeout
        self.open: set[HttpConnection] = set()
        self.seen = 0
        self.clock = _Clock()

    def sweep(self, now: float) -> None:
        """Close what has been quiet for longer than the keep-alive timeout. A connection that
        received data, or has a reply pending, since the last sweep counts as active now (the
        sweep, not every request, reads the clock)."""
        for conn in list(self.open):
            if conn.touched or conn.busy:
                conn.touched = False
                conn.quiet_since = now
            elif now - conn.quiet_since > self.keepalive_timeout:
                conn.close()

    def close_all(self) -> None:
        for conn in list(self.open):
            conn.close()


class HttpConnection(asyncio.Protocol):
    def __init__(self, handler: Handler, connections: Connections, max_body: int) -> None:
        self._handler = handler
        self._connections = connections
        self._max_body = max_body
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.peer = "?"
        self._pending: collections.deque[tuple[Request, bool]] = collections.deque()
        self.busy = False  # a reply is being awaited: later requests wait in `_pending`
        self.touched = False  # data came in since the last idle sweep
        self.quiet_since = self._loop.time()
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._head_size = 0
        self._body_size = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one without subclassing it
        peer = self._transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self._connections.open.add(self)
        self._connections.seen += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.open.discard(self)
        self._pending.clear()

    def data_received(self, data: bytes) -> None:
        self.touched = True
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

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset()

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
        too_large = self._body_size > self._max_body
        request = Request(
            method=self._parser.get_method().decode("ascii", "replace"),
            path=unquote(httptools.parse_url(self._url).path.decode("latin-1")),
            headers=self._headers,
            body=b"" if too_large else b"".join(self._body),
            peer=self.peer,
            too_large=too_large,
        )
        keep_alive = self._parser.should_keep_alive()
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
        if not keep_alive:
            transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """A request that cannot be parsed or is too big to read: answer and close."""
        body = json.dumps({"error": message}).encode()
        self._write(Reply(status, body, "application/json", close=True), keep_alive=False)


class CoalescingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]  # an alias of the platform's
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


async def serve(handler: Handler, sock: Any, ssl: Any, max_body: int, keepalive_timeout: float,
                backlog: int = 1024) -> tuple[asyncio.AbstractServer, Connections]:
    """Serve `handler` on a listening socket (TLS when `ssl` is an SSLContext); idle connections
    are swept from the loop every few seconds."""
    loop = asyncio.get_running_loop()
    connections = Connections(keepalive_timeout)
    server = await loop.create_server(lambda: HttpConnection(handler, connections, max_body), sock=sock, ssl=ssl,
                                      backlog=backlog)

    def sweep() -> None:
        connections.sweep(loop.time())
        if server.is_serving():
            loop.call_later(min(IDLE_SWEEP_SECONDS, keepalive_timeout), sweep)

    loop.call_later(min(IDLE_SWEEP_SECONDS, keepalive_timeout), sweep)
    return server, connections
