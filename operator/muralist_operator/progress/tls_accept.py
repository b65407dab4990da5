"""TLS for many connections that mostly wait: nothing is spent on a client until it speaks.

asyncio's TLS (`create_server(ssl=...)`) sets up OpenSSL's state and a 256 KiB read buffer for
every accepted socket, before the client has sent a byte: 1,500 idle TCP connections took the
operator from 201 to 645 MiB (measured on 2,000 with benchmarks/progress_flood.py: ~300 KiB
each). Here the server listens without TLS; an accepted connection waits behind `AwaitHello`
(the HTTP connection it will carry, ~5 KiB) until its first bytes arrive, and only then gets a
TLS layer, `LeanTls`: asyncio's own SSLProtocol with a 16 KiB read buffer, a TLS record's size
(the endpoint's requests are a few hundred bytes; a larger buffer only saves loop iterations
on bulk transfers that never happen here). This is what `loop.start_tls` does, minus the buffer.

The HTTP connection (http1.HttpConnection) is registered with its server's `Connections` from
the moment the socket is accepted, so the connection cap and the handshake timeout cover a
client that never sends its hello.
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from typing import Any, Protocol

# A TLS record carries at most 16 KiB of plaintext (RFC 8446 5.1), plus its header and tag.
READ_BUFFER_BYTES = 16 * 1024 + 256


class Carried(Protocol):
    """What the TLS layer carries: an http1.HttpConnection."""

    def accepted(self, transport: asyncio.BaseTransport) -> None:
        """The socket was accepted (TLS not started): count it, start its handshake clock."""
        ...

    def forget(self) -> None:
        """The socket is gone (idempotent)."""
        ...


class LeanTls(sslproto.SSLProtocol):
    """asyncio's server-side TLS with a read buffer of one TLS record (see the module docstring)."""

    max_size = READ_BUFFER_BYTES

    def __init__(self, loop: asyncio.AbstractEventLoop, carried: Any, context: ssl.SSLContext,
                 handshake_timeout: float) -> None:
        # The shutdown's wait for the client's close_notify is bounded like the handshake.
        # typeshed has the waiter required and the timeouts whole seconds; CPython takes None and floats.
        super().__init__(loop, carried, context, None,  # type: ignore[arg-type]
                         server_side=True, ssl_handshake_timeout=handshake_timeout,  # type: ignore[arg-type]
                         ssl_shutdown_timeout=handshake_timeout)
        self._carried: Carried = carried

    def connection_lost(self, exc: BaseException | None) -> None:
        # asyncio tells the carried protocol only when its handshake had completed.
        super().connection_lost(exc)
        self._carried.forget()


class AwaitHello(asyncio.Protocol):
    """An accepted socket before the client's first bytes: no TLS state, no buffer."""

    def __init__(self, carried: Carried, context: ssl.SSLContext, handshake_timeout: float) -> None:
        self._carried = carried
        self._context = context
        self._handshake_timeout = handshake_timeout
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._carried.accepted(transport)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        tls = LeanTls(asyncio.get_running_loop(), self._carried, self._context, self._handshake_timeout)
        transport.set_protocol(tls)
        tls.connection_made(transport)
        view = memoryview(data)
        while view and not transport.is_closing():  # a hello larger than the buffer comes in pieces
            buffer = tls.get_buffer(len(view))
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            tls.buffer_updated(n)
            view = view[n:]

    def connection_lost(self, exc: Exception | None) -> None:
        self._carried.forget()
