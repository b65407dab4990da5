"""The endpoint's TLS layer (tls_accept: ssl.SSLObject over memory BIOs, started once a client
speaks), under the HTTP framing of http1, spoken to by the standard library's TLS client."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest
from muralist_operator.progress import http1
from muralist_operator.progress.connections import Limits
from muralist_operator.progress.tls import issue, new_ca, server_context

CA, CA_KEY = new_ca()
MATERIAL = issue(["127.0.0.1"], CA, CA_KEY)


async def _later(reply: http1.Reply) -> http1.Reply:
    await asyncio.sleep(0.2)  # the connection's reading is paused meanwhile
    return reply


def handler(request: http1.Request) -> http1.Reply | asyncio.Future[http1.Reply]:
    reply = http1.Reply(200, request.path.encode(), "text/plain")
    return asyncio.ensure_future(_later(reply)) if request.path == "/later" else reply


class TlsServer:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server, self.connections = self.loop.run_until_complete(
            http1.serve(handler, sock, server_context(MATERIAL), 1024, Limits(idle_timeout=30.0)))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def on_loop(self, read: Callable[[], int]) -> int:
        return asyncio.run_coroutine_threadsafe(self._call(read), self.loop).result(5)

    @staticmethod
    async def _call(read: Callable[[], int]) -> int:
        return read()

    def open_connections(self) -> int:
        return self.on_loop(lambda: len(self.connections.open))

    def stop(self) -> None:
        def close() -> None:
            self.server.close()
            self.connections.close_all()
            self.loop.stop()

        self.loop.call_soon_threadsafe(close)
        self.thread.join(5)
        self.loop.close()

    def tls_client(self) -> ssl.SSLSocket:
        context = ssl.create_default_context(cadata=CA.decode())
        return context.wrap_socket(socket.create_connection(("127.0.0.1", self.port), timeout=5),
                                   server_hostname="127.0.0.1")


@pytest.fixture
def server() -> Iterator[TlsServer]:
    s = TlsServer()
    try:
        yield s
    finally:
        s.stop()


def request(path: str, close: bool = False) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{'Connection: close' if close else ''}\r\n\r\n".encode()


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if condition():
            return True
        done.wait(0.02)
    return condition()


class RecordClient:
    """A TLS client over a plain socket (ssl.SSLObject): records can be sent together, in one write."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        context = ssl.create_default_context(cadata=CA.decode())
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self.outgoing.read())
                chunk = self.sock.recv(65536)
                assert chunk, "the server closed the connection during the handshake"
                self.incoming.write(chunk)
        self.sock.sendall(self.outgoing.read())

    def send_records(self, *plaintexts: bytes) -> None:
        for plaintext in plaintexts:
            self.tls.write(plaintext)  # a record each
        self.sock.sendall(self.outgoing.read())

    def read_until_closed(self) -> bytes:
        received = b""
        while True:
            try:
                data = self.tls.read(65536)
            except ssl.SSLWantReadError:
                data = None
            if data == b"":  # the server's close_notify
                return received
            if data:
                received += data
                continue
            chunk = self.sock.recv(65536)
            assert chunk, f"the socket closed without a close_notify after {received!r}"
            self.incoming.write(chunk)


def test_requests_in_records_that_came_together_are_answered_after_a_paused_one(server: TlsServer) -> None:
    """/later pauses the connection's reading while its reply is awaited; the request behind it came
    in the same read of the socket, in a record of its own, and waits inside the TLS layer (the
    socket has nothing more to say): it is answered once reading resumes, in order."""
    client = RecordClient(server.port)
    try:
        client.send_records(request("/later"), request("/next", close=True))
        received = client.read_until_closed()  # the reply to /next says Connection: close; then close_notify
    finally:
        client.sock.close()
    assert received.count(b"HTTP/1.1 200 OK") == 2, received
    assert received.index(b"/later") < received.index(b"/next")


def test_the_server_ends_with_close_notify_and_forgets_the_connection(server: TlsServer) -> None:
    client = RecordClient(server.port)
    try:
        client.send_records(request("/first"))
        assert wait_until(lambda: server.open_connections() == 1)
        client.send_records(request("/bye", close=True))
        received = client.read_until_closed()  # fails on a socket cut without the server's close_notify
    finally:
        client.sock.close()
    assert b"/first" in received and b"/bye" in received
    assert wait_until(lambda: server.open_connections() == 0)


def test_a_client_that_says_goodbye_is_forgotten(server: TlsServer) -> None:
    tls = server.tls_client()
    tls.sendall(request("/readyz"))
    assert b"200 OK" in tls.recv(65536)
    raw = tls.unwrap()  # the client's close_notify; the server answers with its own
    raw.close()
    assert wait_until(lambda: server.open_connections() == 0)


def test_plain_http_on_the_tls_port_is_closed_and_forgotten(server: TlsServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as plain:
        plain.sendall(request("/readyz"))
        received = b""
        while chunk := plain.recv(65536):
            received += chunk
    assert b"HTTP/1.1" not in received  # at most a TLS alert
    assert wait_until(lambda: server.open_connections() == 0)
