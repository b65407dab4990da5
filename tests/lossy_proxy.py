"""A TCP proxy on loopback that loses a reply after the server acted on its request.

What a client sees when a connection breaks between the server's answer and the client: the server
applied the request, the client never heard, reconnects and sends it again. `lose_reply(after=n)`:
the proxy passes `n` more replies, then swallows the next one and closes that connection (both
ends); new connections are carried as before.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from types import TracebackType


class LossyProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pass: int | None = None  # replies to pass before the one lost; None: lose none
        self.lost = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="lossy-proxy", daemon=True).start()

    def lose_reply(self, after: int = 0) -> None:
        with self._lock:
            self._pass = after

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def __enter__(self) -> LossyProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._carry, args=(client, upstream), daemon=True).start()

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

    def _carry(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                readable, _, _ = select.select([client, upstream], [], [], 0.5)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        raise OSError("closed")
                    if sock is upstream and self._lose():
                        raise OSError("reply lost")  # the server acted; the client never hears
                    (upstream if sock is client else client).sendall(data)
        except OSError:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
