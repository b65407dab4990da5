"""A TCP proxy on loopback that can stop answering, or lose a reply: a server gone silent, or a connection
that broke after the server acted, as a client sees them.

`forward` (the start): each connection is carried to the upstream address, bytes both ways.
`hold()`: from then on the proxy still accepts connections but carries nothing: every
connection open at that moment and every one accepted while holding goes silent (no bytes
either way, no reset, no close), as behind a load balancer that lost its upstream. `resume()`:
new connections are carried again; the silent ones stay silent until the client gives up on
them (a connection that died does not come back). TLS passes through untouched.
`lose_reply(after=n)`: the proxy passes `n` more replies (data from upstream), then swallows the
next one and closes that connection, both ends: the server applied the request, the client never
heard, reconnects and sends it again. New connections are carried as before.
"""

from __future__ import annotations

import select
import socket
import threading
from types import TracebackType


class _Connection:
    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client, self.upstream = client, upstream
        self.silent = upstream is None
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is not None:
                sock.close()


class TcpProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._holding = False
        self._connections: list[_Connection] = []
        self._pass: int | None = None  # replies to pass before the one lost; None: lose none
        self.lost = 0
        self.accepted = 0
        self.accepted_while_holding = 0
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    def hold(self) -> None:
        with self._lock:
            self._holding = True
            for conn in self._connections:
                conn.silent = True

    def resume(self) -> None:
        with self._lock:
            self._holding = False

    def lose_reply(self, after: int = 0) -> None:
        with self._lock:
            self._pass = after

    def _lose(self) -> bool:
        """Whether this reply is the one to lose (counting down the ones to pass)."""
        with self._lock:
            if self._pass is None:
                return False
            if self._pass > 0:
                self._pass -= 1
                return False
            self._pass = None
            self.lost += 1
            return True

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                holding = self._holding
                self.accepted += 1
                self.accepted_while_holding += holding
            upstream = None
            if not holding:
                try:
                    upstream = socket.create_connection(self.upstream, timeout=10)
                except OSError:
                    client.close()
                    continue
            conn = _Connection(client, upstream)
            with self._lock:
                self._connections.append(conn)
            if upstream is not None:
                threading.Thread(target=self._carry, args=(conn,), name="tcp-proxy-carry", daemon=True).start()

    def _carry(self, conn: _Connection) -> None:
        assert conn.upstream is not None
        peers = {conn.client: conn.upstream, conn.upstream: conn.client}
        try:
            while not conn.closed.is_set():
                if conn.silent:
                    conn.closed.wait()  # carry nothing, close nothing: the client must give up on it
                    return
                readable, _, _ = select.select(list(peers), [], [], 0.2)
                for sock in readable:
                    if conn.silent:
                        break
                    data = sock.recv(65536)
                    if not data or (sock is conn.upstream and self._lose()):
                        conn.close()  # (a lost reply: the server acted, the client never hears)
                        return
                    peers[sock].sendall(data)
        except OSError:
            conn.close()
