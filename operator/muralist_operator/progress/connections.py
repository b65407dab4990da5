"""What one client may hold of the progress endpoint (`Limits`), and the table of open connections
that enforces it (`Connections`).

Any pod of the cluster can open connections to the endpoint, and each one costs memory, so
connections are capped and each is on a clock. A TLS handshake (counted from the accept, before
the client's hello: see tls_accept) and every request (its first byte to its last) must finish
within their timeouts. Only a connection that has carried an authenticated request (an accepted
post) may then idle for the keep-alive timeout; any other is closed when it has been quiet for
the request timeout. At the cap, the oldest connection that has not authenticated (and awaits no
reply) is dropped for the new one; when every open connection has authenticated, the new one is.
So a flood of idle or trickling connections holds at most `max_connections` small sockets for
seconds, and pods that post keep their connections through it. The memory closed connections
freed goes back to the system after a wave of closes (`Connections._give_back`).
"""

from __future__ import annotations

import collections
import ctypes
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

log = logging.getLogger("muralist.progress.http")

# How often the clocks of open connections are read (a timeout fires up to this much late).
SWEEP_SECONDS = 1.0
# A sweep later than this was held up by the server itself (a burst of TLS handshakes, a starved
# process): that time is not counted against the clients (see Connections.now).
LATE_SECONDS = 0.25
# Connections the server ended, by reason, are logged at most this often.
CLOSED_LOG_SECONDS = 60.0
# Freed memory is given back to the system once this many connections have closed (~20 KiB each
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
    TLS hello and ~20 KiB after its handshake (benchmarks/progress_flood.py), so the cap bounds a
    flood to tens of MiB (all handshaken: ~80 MiB), and the timeouts to seconds. The defaults
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


class ConnectionPhase(enum.Enum):
    HANDSHAKE = "handshake"  # accepted; TLS not done yet
    WAITING = "waiting"  # between requests
    READING = "reading"  # a request has begun and is not complete


class Connection(Protocol):
    """What the table reads and does of a connection (an http1.HttpConnection)."""

    busy: bool  # a reply is being awaited
    authenticated: bool  # it carried an accepted post
    phase: ConnectionPhase
    since: float  # when `phase` (or, while waiting, the last reply) began, on `Connections.now`

    def abort(self, reason: str) -> None:
        """End it now, counting `reason`."""
        ...

    def close(self, reason: str | None = None) -> None:
        """End it gracefully."""
        ...


class Connections:
    """The open connections of one server: capped, on their clocks (swept), closed on stop."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: dict[Connection, None] = {}
        # Those that have not authenticated, oldest first: the ones dropped at the cap.
        self.unproven: dict[Connection, None] = {}
        self.seen = 0
        self.high_water = 0  # the most connections open at once since memory was last given back
        self._open_last_sweep = 0
        self.held_up = 0.0  # seconds the server's loop was too busy to serve, in all
        self.closed: collections.Counter[str] = collections.Counter()  # ended by the server, by reason
        self._logged: collections.Counter[str] = collections.Counter()
        self._logged_at = -CLOSED_LOG_SECONDS

    def admit(self, conn: Connection) -> bool:
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

    def proven(self, conn: Connection) -> None:
        self.unproven.pop(conn, None)

    def forget(self, conn: Connection) -> None:
        self.open.pop(conn, None)
        self.unproven.pop(conn, None)

    def now(self) -> float:
        """The connections' clock: monotonic time without the time the loop was held up. 1,024
        pods connecting at once queue their TLS handshakes behind each other: on a loaded machine
        the last waited 15-25 s for the server (benchmarks/progress_load.py), which is not
        theirs to answer for."""
        return time.monotonic() - self.held_up

    def deadline(self, conn: Connection) -> tuple[float, str] | None:
        """When this connection is to be closed, and why; None while a reply is awaited."""
        if conn.busy:
            return None
        limits = self.limits
        if conn.phase is ConnectionPhase.HANDSHAKE:
            return conn.since + limits.handshake_timeout, "handshake timeout"
        if conn.phase is ConnectionPhase.READING:
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
