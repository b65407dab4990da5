"""The coalescing selector: one wake-up for a burst of readable sockets."""

from __future__ import annotations

import selectors
import socket
import threading
import time

from muralist_operator.progress.coalesce import CoalescingSelector


def test_the_coalescing_selector_serves_a_burst_with_one_wake_up() -> None:
    selector = CoalescingSelector(window=0.5)
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        for reader, _ in pairs:
            selector.register(reader, selectors.EVENT_READ)
        first, second = (writer for _, writer in pairs)
        # The second socket becomes readable while the selector lingers after the first.
        threading.Timer(0.05, second.send, args=(b"y",)).start()
        first.send(b"x")
        started = time.monotonic()
        ready = selector.select(timeout=5)
        assert time.monotonic() - started >= 0.5
        assert sorted(key.fileobj.fileno() for key, _ in ready) == sorted(r.fileno() for r, _ in pairs)
        again = selector.select(timeout=0)  # nothing was read: still both, each once
        assert sorted(key.fileobj.fileno() for key, _ in again) == sorted(r.fileno() for r, _ in pairs)
    finally:
        selector.close()
        for a, b in pairs:
            a.close()
            b.close()
