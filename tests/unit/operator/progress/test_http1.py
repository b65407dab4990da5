"""The progress endpoint's HTTP/1.1 framing, and the connection limits it is served under, spoken
to over raw sockets (plain TCP: TLS is tls_accept's, covered by test_tls_accept.py and test_server.py)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from muralist_operator.progress import http1
from muralist_operator.progress.connections import Limits

MAX_BODY = 64


async def _later(reply: http1.Reply) -> http1.Reply:
    await asyncio.sleep(0.05)  # long enough for a pipelined quick request to be answered first, were it not held
    return reply


def handler(request: http1.Request) -> http1.Reply | asyncio.Future[http1.Reply]:
    if request.path == "/boom":
        raise RuntimeError("handler bug")
    if request.path == "/block":
        time.sleep(1.0)  # holds the server's loop, as a burst of TLS handshakes on a loaded machine does
    body = b"%s %s %s %d" % (request.method.encode(), request.path.encode(), request.body, request.too_large)
    reply = http1.Reply(200, body, "text/plain", (("X-Seen", request.headers.get("x-seen", "-")),),
                        authenticated=request.path == "/auth")
    if request.path == "/later":
        return asyncio.ensure_future(_later(reply))
    return reply


class Server:
    def __init__(self, limits: Limits | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server, self.connections = self.loop.run_until_complete(
            http1.serve(handler, sock, None, MAX_BODY, limits or Limits(idle_timeout=30.0)))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        def close() -> None:
            self.server.close()
            self.connections.close_all()
            self.loop.stop()

        self.loop.call_soon_threadsafe(close)
        self.thread.join(5)
        self.loop.close()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.stop()


def read_reply(sock: socket.socket, buffered: bytearray, no_body: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One reply off the socket (what is read past it stays in `buffered`); a reply to HEAD has
    a Content-Length but no body."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a full reply: {bytes(buffered)!r}"
        buffered += chunk
    head, _, _ = bytes(buffered).partition(b"\r\n\r\n")
    del buffered[:len(head) + 4]
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    length = 0 if no_body else int(headers.get("content-length", "0"))
    while len(buffered) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a body"
        buffered += chunk
    body = bytes(buffered[:length])
    del buffered[:length]
    return int(status_line.split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def post(path: str, body: bytes = b"", extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_keep_alive_replies_carry_date_and_length(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        for i in range(3):
            sock.sendall(post(f"/echo/{i}", b"hi", "X-Seen: yes\r\n"))
            status, headers, body = read_reply(sock, buf)
            assert (status, body, headers["x-seen"], headers["content-type"]) == (200, f"POST /echo/{i} hi 0".encode(),
                                                                                  "yes", "text/plain")
            assert "connection" not in headers and headers["date"].endswith("GMT")
    assert server.connections.seen == 1


def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sock.sendall(post("/later", b"1") + post("/now", b"2") + post("/later", b"3"))
        bodies = [read_reply(sock, buf)[2] for _ in range(3)]
    assert bodies == [b"POST /later 1 0", b"POST /now 2 0", b"POST /later 3 0"]


def test_a_body_over_the_limit_is_flagged_and_the_connection_survives(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sock.sendall(post("/big", b"x" * (MAX_BODY + 1)) + post("/small", b"ok"))
        assert read_reply(sock, buf)[2] == b"POST /big  1"
        assert read_reply(sock, buf)[2] == b"POST /small ok 0"


def test_a_body_beyond_the_discard_cap_is_refused_and_closed(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sent = MAX_BODY + http1.MAX_DISCARD_BYTES + 1  # the cap's next byte; the rest is never sent
        sock.sendall(f"POST /huge HTTP/1.1\r\nContent-Length: {10 * sent}\r\n\r\n".encode() + b"x" * sent)
        status, headers, body = read_reply(sock, buf)
        assert (status, headers["connection"]) == (413, "close") and f"at most {MAX_BODY} bytes".encode() in body
        assert closed_by_server(sock)


def test_an_oversized_head_is_431_and_closed(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sock.sendall(post("/x", extra=f"X-Pad: {'a' * http1.MAX_HEAD_BYTES}\r\n"))
        status, headers, body = read_reply(sock, buf)
        assert (status, headers["connection"]) == (431, "close") and b"at most" in body
        assert closed_by_server(sock)


def test_a_malformed_request_is_400_and_closed(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, headers, body = read_reply(sock, buf)
        assert (status, headers["connection"]) == (400, "close") and b"malformed" in body
        assert closed_by_server(sock)


def test_a_handler_failure_is_a_500_and_the_connection_stays(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sock.sendall(post("/boom") + post("/after"))
        assert read_reply(sock, buf)[0] == 500
        assert read_reply(sock, buf)[2] == b"POST /after  0"


def test_head_has_no_body_and_204_no_length(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sock.sendall(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_reply(sock, buf, no_body=True)
        assert status == 200 and int(headers["content-length"]) == len(b"HEAD /h  0")
        sock.sendall(post("/next"))
        assert read_reply(sock, buf)[2] == b"POST /next  0"  # nothing of HEAD's body was sent before it
    assert b"Content-Length" not in http1.encode(http1.Reply(204), b"now", keep_alive=True)


def test_expect_100_continue_is_answered_before_the_body(server: Server) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sock.sendall(b"POST /e HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert read_reply(sock, buf)[0] == 100
        sock.sendall(b"ok")
        assert read_reply(sock, buf)[2] == b"POST /e ok 0"


@pytest.mark.parametrize("request_bytes", [
    post("/bye", extra="Connection: close\r\n"),
    b"POST /bye HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
], ids=["connection-close", "http-1.0"])
def test_the_client_can_end_the_connection(server: Server, request_bytes: bytes) -> None:
    buf = bytearray()
    with server.connect() as sock:
        sock.sendall(request_bytes)
        status, headers, _ = read_reply(sock, buf)
        assert (status, headers["connection"]) == (200, "close")
        assert closed_by_server(sock)


def test_an_authenticated_connection_idles_for_the_keepalive_timeout_others_for_the_request_timeout() -> None:
    s = Server(Limits(request_timeout=0.3, idle_timeout=1.5))
    try:
        with s.connect() as proven, s.connect() as unproven:
            proven.sendall(post("/auth"))
            unproven.sendall(post("/x"))
            assert read_reply(proven, bytearray())[0] == read_reply(unproven, bytearray())[0] == 200
            started = time.monotonic()
            assert closed_by_server(unproven)  # recv waits (up to its 5 s timeout) for the sweep
            assert time.monotonic() - started < 1.2  # the request timeout and a sweep, not the idle timeout
            assert closed_by_server(proven)
            assert time.monotonic() - started >= 1.2
        assert not s.connections.open
        assert s.connections.closed == {"idle before authenticating": 1, "idle": 1}
    finally:
        s.stop()


def test_a_trickled_request_is_cut_at_the_request_timeout() -> None:
    s = Server(Limits(request_timeout=0.5, idle_timeout=30))
    try:
        with s.connect() as sock:
            sock.sendall(post("/auth"))
            assert read_reply(sock, bytearray())[0] == 200  # authenticated: may idle 30 s
            started = time.monotonic()
            for byte in post("/slow", b"x" * 20):  # a byte every 50 ms: never quiet, never done
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.05)
            assert closed_by_server(sock)
            assert 0.5 <= time.monotonic() - started < 2.5
        assert s.connections.closed["request timeout"] == 1
    finally:
        s.stop()


def test_time_the_server_itself_was_held_up_does_not_count_against_a_client() -> None:
    s = Server(Limits(request_timeout=0.5))
    try:
        with s.connect() as waiting, s.connect() as blocker:
            blocker.sendall(post("/block"))  # one second of the loop, twice the request timeout
            assert read_reply(blocker, bytearray())[0] == 200
            time.sleep(0.25)  # two sweeps after the hold-up
            waiting.sendall(post("/x"))
            assert read_reply(waiting, bytearray())[0] == 200
        assert "idle before authenticating" not in s.connections.closed
    finally:
        s.stop()


def test_at_the_cap_the_oldest_unauthenticated_connection_makes_room() -> None:
    s = Server(Limits(max_connections=3))
    try:
        with s.connect() as proven, s.connect() as old, s.connect() as young:
            proven.sendall(post("/auth"))
            assert read_reply(proven, bytearray())[0] == 200
            young.sendall(post("/x"))  # served, but not authenticated: still droppable
            assert read_reply(young, bytearray())[0] == 200
            with s.connect() as newest:
                assert closed_by_server(old)
                newest.sendall(post("/auth"))
                assert read_reply(newest, bytearray())[0] == 200
                with s.connect() as next_one:
                    assert closed_by_server(young)
                    next_one.sendall(post("/auth"))
                    assert read_reply(next_one, bytearray())[0] == 200
                    # Every open connection has authenticated: a new one is refused, they stay.
                    with s.connect() as refused:
                        assert closed_by_server(refused)
                    for sock in (proven, newest, next_one):
                        sock.sendall(post("/auth"))
                        assert read_reply(sock, bytearray())[0] == 200
        assert s.connections.closed == {"dropped for a newer connection at the cap": 2, "over capacity": 1}
    finally:
        s.stop()
