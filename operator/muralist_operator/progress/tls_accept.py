"""TLS for many connections that mostly wait: nothing is spent on a client until it speaks.

asyncio's TLS (`create_server(ssl=...)`, and `loop.start_tls`) sets up OpenSSL's state and a
256 KiB read buffer for every accepted socket, before the client has sent a byte: 1,500 idle TCP
connections took the operator from 201 to 645 MiB (measured on 2,000 with
benchmarks/progress_flood.py: ~300 KiB each). Here the server listens without TLS; an accepted
connection (`LazyTls`, beside the HTTP connection it will carry: ~5 KiB) holds no TLS state until
its first bytes arrive, and only then gets one: the standard library's `ssl.SSLObject` over two
`ssl.MemoryBIO`s (the documented way to run TLS over a transport of one's own), read a TLS
record at a time (the endpoint's requests are a few hundred bytes). OpenSSL gives its buffers
back while a connection waits (CPython sets SSL_MODE_RELEASE_BUFFERS), so a kept-alive pod's
connection stays small between posts.

The carried connection (http1.HttpConnection) is told of the socket at its accept (`accepted`:
the connection cap and the handshake clock of connections.py cover a client that never sends
its hello, or never finishes its handshake), of a transport once the handshake is done
(`connection_made`, with a `TlsTransport`), and of the socket's end (`forget`, whatever stage
it reached). Closing sends the TLS close_notify, then closes the socket once what was written is
out; it does not wait for the client's close_notify (RFC 8446 6.1 does not ask the closer to).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, Protocol

# A TLS record carries at most 16 KiB of plaintext (RFC 8446 5.1), plus its header and tag.
READ_BUFFER_BYTES = 16 * 1024 + 256


class Carried(Protocol):
    """What the TLS layer carries: an http1.HttpConnection."""

    def accepted(self, transport: asyncio.BaseTransport) -> None:
        """The socket was accepted (TLS not started): count it, start its handshake clock."""
        ...

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """The handshake is done: requests come in and replies go out through `transport`."""
        ...

    def data_received(self, data: bytes) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...

    def forget(self) -> None:
        """The socket is gone (idempotent)."""
        ...


class LazyTls(asyncio.Protocol):
    """An accepted socket: no TLS state before the client's first bytes, then the server side of
    TLS carrying `carried` (see the module docstring)."""

    def __init__(self, carried: Carried, context: ssl.SSLContext) -> None:
        self._carried = carried
        self._context = context
        self._socket: asyncio.Transport | None = None
        self._tls: ssl.SSLObject | None = None
        self._incoming: ssl.MemoryBIO | None = None
        self._outgoing: ssl.MemoryBIO | None = None
        self._transport: TlsTransport | None = None  # once the handshake is done
        self.closing = False
        self.paused = False

    # -- the socket (asyncio.Protocol) ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._socket = transport  # type: ignore[assignment]
        self._carried.accepted(transport)

    def data_received(self, data: bytes) -> None:
        if self.closing or self._socket is None or self._socket.is_closing():
            return
        if self._tls is None:  # the client's first bytes: its hello
            self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            self._tls = self._context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        assert self._incoming is not None
        self._incoming.write(data)
        if self._transport is None:
            self._handshake()
        else:
            self.read()

    def eof_received(self) -> bool | None:
        return None  # the client is done: the socket closes (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._carried.connection_lost(exc)
        self._carried.forget()
        self.closing = True
        self._tls = self._incoming = self._outgoing = None
        self._socket = self._transport = None

    # -- TLS ------------------------------------------------------------------------------------

    def _handshake(self) -> None:
        assert self._tls is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:  # more of the client's flight to come
            self._flush()
            return
        except (ssl.SSLError, ValueError):  # not TLS, or a client we cannot talk to: its alert, then the end
            self._flush()
            self._close_socket()
            return
        self._flush()
        self._transport = TlsTransport(self)
        self._carried.connection_made(self._transport)
        self.read()  # a request sent with the client's Finished

    def read(self) -> None:
        """Hand on the plaintext that has come in, a record at a time, until none is left or the
        carried connection pauses reading."""
        while not self.paused and not self.closing and self._tls is not None:
            try:
                data = self._tls.read(READ_BUFFER_BYTES)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError:
                self.abort()
                return
            if not data:  # the client's close_notify (CPython reads it as b"")
                self.close()
                return
            self._carried.data_received(data)
        self._flush()

    def write(self, data: bytes) -> None:
        if self.closing or self._tls is None:
            return
        try:
            self._tls.write(data)
        except ssl.SSLError:
            self.abort()
            return
        self._flush()

    def _flush(self) -> None:
        """What TLS has to send (handshake messages, records, alerts) onto the socket."""
        outgoing, socket = self._outgoing, self._socket
        if outgoing is not None and socket is not None and outgoing.pending:
            socket.write(outgoing.read())

    def close(self) -> None:
        """close_notify, then the socket, once what was written is out."""
        if self.closing:
            return
        self.closing = True
        if self._tls is not None:
            with contextlib.suppress(ssl.SSLError):  # SSLWantReadError: ours is sent, the client's not awaited
                self._tls.unwrap()
            self._flush()
        self._close_socket()

    def _close_socket(self) -> None:
        self.closing = True
        if self._socket is not None:
            self._socket.close()

    def abort(self) -> None:
        self.closing = True
        if self._socket is not None:
            self._socket.abort()

    def pause_reading(self) -> None:
        self.paused = True
        if self._socket is not None:
            self._socket.pause_reading()

    def resume_reading(self) -> None:
        self.paused = False
        if self._socket is not None and not self.closing:
            self._socket.resume_reading()
            # Plaintext that came in with the last records read, and waits inside the TLS object.
            asyncio.get_running_loop().call_soon(self.read)

    def extra(self, name: str, default: Any) -> Any:
        if name == "ssl_object":
            return self._tls
        if name == "sslcontext":
            return self._context
        if name == "peercert":
            return self._tls.getpeercert() if self._tls is not None else default
        if name == "cipher":
            return self._tls.cipher() if self._tls is not None else default
        return self._socket.get_extra_info(name, default) if self._socket is not None else default


class TlsTransport(asyncio.Transport):
    """The transport the carried connection reads plaintext from and writes it to."""

    def __init__(self, layer: LazyTls) -> None:
        super().__init__()
        self._layer = layer

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._layer.write(bytes(data))

    def close(self) -> None:
        self._layer.close()

    def abort(self) -> None:
        self._layer.abort()

    def is_closing(self) -> bool:
        return self._layer.closing

    def pause_reading(self) -> None:
        self._layer.pause_reading()

    def resume_reading(self) -> None:
        self._layer.resume_reading()

    def is_reading(self) -> bool:
        return not self._layer.paused and not self._layer.closing

    def can_write_eof(self) -> bool:
        return False  # TLS has close_notify, not a half close

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._layer.extra(name, default)
