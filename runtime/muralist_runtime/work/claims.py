"""The work-claim store: ranks claim the next chunk of items from one shared counter.

Fixed shards make the slowest GPU set the job's end; claiming chunks from a shared counter lets
a fast rank take more. Pods do not share a torch.distributed process group (each pod is its
own torchrun world), so the counter lives in a standalone c10d `TCPStore`: the first pod's
local rank 0 hosts it (`ClaimServer`) on a known port, and every rank of every pod connects to
it by host name (`ClaimClient`). A claim is one `add` round trip, so its cost is one RTT.

Failure model, as designed:
- The host pod restarts: its counter starts again at 0. Callers skip chunks already on disk,
  so a restart costs a re-scan, never a lost item.
- A client loses the store (host restarting, a network blip): `next_chunk` logs once per
  outage, reconnects with exponential backoff, and retries for up to OUTAGE_SECONDS (the
  first pod's retry: the Job controller's back-off of up to 6 minutes, then its start), then
  fails with ClaimStoreUnavailable naming the store's address (retryable: the pod is retried).
- A claim whose reply was lost (the server counted it, the client never heard) is retried and
  claims the next chunk: the lost one is claimed by nobody. A caller that must cover every
  chunk sweeps for chunks missing on disk after the counter runs past the end.

TCPStore quirks this module works around (torch 2.15, read in torch/distributed and measured):
- A client store never recovers a broken connection: after `add` raises DistNetworkError
  ("Failed to recv, got 0 bytes" then "Broken pipe" on every later call, even once the server
  is back), only a new TCPStore object connects again. So the client drops and rebuilds it.
- The server listens on every interface whatever `host_name` says; the master's `host_name`
  is only where its own built-in client connects, so it must be reachable locally.
- No timeout bounds `add`: on a black-holed connection (a partition, no RST) it blocks until
  the kernel gives up on the socket (~15 min of TCP retransmissions), whatever the
  constructor's `timeout` or `set_timeout` say (measured through a proxy that stops
  forwarding). So each claim runs on a worker thread (`add` releases the GIL) and is abandoned
  after `op_timeout_s`; the stuck thread is a daemon and exits when its socket errors.
- Connect attempts overshoot their timeout by a random back-off (a 2 s timeout took ~3.7 s),
  and an unresolvable host name is retried like a refused connection (a pod's DNS record
  that is not published yet).
- Timeouts of operations raise DistStoreError, network failures DistNetworkError; both are
  RuntimeErrors. `use_libuv` matters only for the server (clients report libuvBackend=True).
- Every failure is logged by c10d in C++ with a full stack trace to stderr; set
  TORCH_CPP_LOG_LEVEL=ERROR in the pod to keep the warnings out of its logs.

torch is imported lazily: importing muralist_runtime modules must stay torch-free.
"""

from __future__ import annotations

import datetime
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("muralist.claims")

# How long a client waits out one outage of the store before it fails.
OUTAGE_SECONDS = 900.0
# How often `reachable` tries a refused port again.
PROBE_RETRY_SECONDS = 0.25


class ClaimStoreUnavailable(RuntimeError):
    """The claim store stayed unreachable for longer than the client's bound."""


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


class _Worker:
    """One daemon thread that runs calls, so a call stuck in C++ can be abandoned with its thread.

    A persistent thread costs a queue hand-off per claim (tens of µs); a thread per claim
    cost ~170 µs here.
    """

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], dict[str, Any], threading.Event] | None] = (
            queue.SimpleQueue())
        threading.Thread(target=self._run, name="muralist-claims", daemon=True).start()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, box, done = call
            try:
                box["value"] = fn()
            except BaseException as e:  # handed to the caller's thread, raised there
                box["error"] = e
            done.set()

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()
        self._calls.put((fn, box, done))
        if not done.wait(timeout_s):
            raise TimeoutError(f"no answer from the claim store in {timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def stop(self) -> None:
        """Let the thread exit once it is free (now, or when its stuck call returns)."""
        self._calls.put(None)


class ClaimServer:
    """Hosts the counters: a TCPStore server that lives as long as this object.

    `port=0` binds an ephemeral port (tests); `.port` says which. It binds every interface.
    The libuv backend serves from its own C++ thread without the GIL: a hosting rank busy in
    Python slows claims only by the CPU it takes (benchmarks/claim_store.py).
    """

    def __init__(self, port: int, host: str = "127.0.0.1", *, use_libuv: bool = True):
        from torch.distributed import TCPStore

        self._store: Any = TCPStore(host, port, None, True, _timedelta(30), wait_for_workers=False,
                                    use_libuv=use_libuv)
        self.port: int = self._store.port

    def close(self) -> None:
        """Stop serving: connected clients' next claim fails, and they start reconnecting."""
        self._store = None

    def __enter__(self) -> ClaimServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClaimClient:
    """Claims chunk numbers 0, 1, 2, ... of one namespace, shared by every client of the store.

    Nothing connects until the first claim, so a client may be built before the server is up:
    that claim waits for it. Thread-safe (one lock around the store connection).

    `connect_timeout_s` bounds one connection attempt, `op_timeout_s` one claim's round trip
    (None: call `add` directly, ~20 µs faster, but a partition then hangs the claim), and
    `give_up_after_s` a whole outage. `on_outage` is called after each
    failed attempt and may raise to stop waiting (a pod that finds the job merged meanwhile:
    the store's host has finished and left, and will not come back).
    """

    def __init__(self, host: str, port: int, namespace: str, connect_timeout_s: float = 10.0,
                 *, give_up_after_s: float = OUTAGE_SECONDS,
                 op_timeout_s: float | None = 30.0, backoff_s: tuple[float, float] = (0.1, 5.0),
                 sleep: Callable[[float], None] = time.sleep, on_outage: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if not 0 < port < 65536:
            raise ValueError(f"claim store port {port} is not a TCP port")
        if not namespace or "/" in namespace:
            raise ValueError(f"claim namespace {namespace!r}: non-empty, without '/'")
        self.host, self.port, self.namespace = host, port, namespace
        self.connect_timeout_s = connect_timeout_s
        self.op_timeout_s = op_timeout_s
        self.give_up_after_s = give_up_after_s
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._clock = clock
        self._on_outage = on_outage
        self._store: Any = None
        self._worker: _Worker | None = None
        self._lock = threading.Lock()
        self._connected_once = False
        self.reconnects = 0  # connections made after the first: for logs and tests

    def next_chunk(self) -> int:
        """The next unclaimed chunk number; each number goes to exactly one claim per server life."""
        return self.add("next", 1) - 1

    def add(self, name: str, amount: int) -> int:
        """Add to the counter `name` of this namespace (0 reads it); returns the new value.

        The same waiting and reconnecting as a claim: the other counters (chunks done, items
        failed) live in the same store and are lost and rebuilt with it.
        """
        key = f"{self.namespace}/{name}"
        return int(self._retry(lambda store: store.add(key, amount)))

    def reachable(self, timeout_s: float) -> bool:
        """Whether the store's port accepts a connection within `timeout_s` (a refused one is
        tried again every PROBE_RETRY_SECONDS).

        A plain socket, not a TCPStore: the store's connect overshoots its timeout by its
        back-off (34 s for 15, measured) and logs a C++ stack trace for every failed try, which
        is all a retried pod of a finished job would show in its log.
        """
        deadline = self._clock() + timeout_s
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=max(deadline - self._clock(), 0.1)):
                    return True
            except OSError:  # refused (nobody listens yet), unresolvable, timed out
                if self._clock() + PROBE_RETRY_SECONDS >= deadline:
                    return False
                self._sleep(PROBE_RETRY_SECONDS)

    def compare_set(self, name: str, expected: str, desired: str) -> str:
        """Set `name` to `desired` if it holds `expected` (counters hold their decimal text); returns
        the value after the call."""
        key = f"{self.namespace}/{name}"
        return bytes(self._retry(lambda store: store.compare_set(key, expected, desired))).decode()

    def append(self, name: str, text: str) -> None:
        """Append to the text value `name` (a list kept in the store, e.g. the chunks a group owns)."""
        key = f"{self.namespace}/{name}"
        self._retry(lambda store: store.append(key, text))

    def text(self, name: str) -> str:
        """The text value `name`, or "" when it was never set (a get would block for it)."""
        key = f"{self.namespace}/{name}"
        return str(self._retry(lambda store: store.get(key).decode() if store.check([key]) else ""))

    def _retry(self, op: Callable[[Any], Any]) -> Any:
        """Run `op(store)`, waiting out and reconnecting after a lost store (see next_chunk)."""
        with self._lock:
            outage_start: float | None = None
            delay = self.backoff_s[0]
            while True:
                try:
                    value = self._call(op)
                except (RuntimeError, OSError) as e:  # DistNetworkError, DistStoreError, TimeoutError
                    self._store = None
                    if isinstance(e, TimeoutError) and self._worker is not None:
                        self._worker.stop()
                        self._worker = None
                    now = self._clock()
                    if outage_start is None:
                        outage_start = now
                        log.warning("claim store %s:%d unreachable (%s); reconnecting%s", self.host, self.port,
                                    str(e).splitlines()[0] if str(e) else type(e).__name__,
                                    f" for up to {self.give_up_after_s:g} s")
                    elif now - outage_start >= self.give_up_after_s:
                        raise ClaimStoreUnavailable(
                            f"claim store {self.host}:{self.port} unreachable for {now - outage_start:.0f} s: is the "
                            "first pod running, and its claim port open to this pod?") from e
                    if self._on_outage is not None:
                        self._on_outage()
                    self._sleep(delay)
                    delay = min(delay * 2, self.backoff_s[1])
                    continue
                if outage_start is not None:
                    log.info("claim store %s:%d reachable again after %.1f s", self.host, self.port,
                             self._clock() - outage_start)
                return value

    def _call(self, op: Callable[[Any], Any]) -> Any:
        if self.op_timeout_s is None:
            if self._store is None:
                self._store = self._adopt(self._connect())
            return op(self._store)
        if self._worker is None:
            self._worker = _Worker()
        if self._store is None:
            # The constructor has its own timeout, overshot by its back-off: allow for both.
            self._store = self._adopt(self._worker.call(self._connect, 2 * self.connect_timeout_s + 1))
        store = self._store
        return self._worker.call(lambda: op(store), self.op_timeout_s)

    def _connect(self) -> Any:
        from torch.distributed import TCPStore

        return TCPStore(self.host, self.port, None, False, _timedelta(self.connect_timeout_s))

    def _adopt(self, store: Any) -> Any:
        """Count a connection this client uses (not one an abandoned worker made too late)."""
        if self._connected_once:
            self.reconnects += 1
        self._connected_once = True
        return store

    def close(self) -> None:
        with self._lock:
            self._store = None
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def __enter__(self) -> ClaimClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
