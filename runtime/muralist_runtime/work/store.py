"""This rank's link to the job's claim store: the first pod's first rank hosts it; the ranks that
write (and the host) claim chunks from it.

A pod retried after the first pod merged the job and left finds no store and nothing left to
do (NothingLeft); so does one that started (or loaded) slower than the whole job took.
"""

from __future__ import annotations

from collections.abc import Callable

from ..world.distributed import Layout
from . import chunks, claims
from .chunks import NothingLeft

# How long a retried pod tries the store before it concludes that a merged job is over.
STORE_PROBE_SECONDS = 15.0


def connect(layout: Layout, merged: Callable[[], bool],
            root: str) -> tuple[claims.ClaimServer | None, claims.ClaimClient | None]:
    """The store this rank hosts (the first pod's first rank), and its client (ranks that write or
    host); `merged`: whether the job in `root` was merged already (its job file says so)."""
    host, port = chunks.claims_address()
    server = claims.ClaimServer(port) if layout.hosts_store else None
    if server is not None:
        host = "127.0.0.1"  # its own store: no DNS needed (the Service's name is for the other pods)
    gone = f"the job was merged in {root} and its first pod is gone"
    if not layout.hosts_store and merged():  # (no server to close: only the host has one)
        probe = claims.ClaimClient(host, port, chunks.NAMESPACE)
        if not probe.reachable(STORE_PROBE_SECONDS):
            # This pod was retried after the first pod merged the job and left: nothing is left.
            raise NothingLeft(gone)

    def merged_meanwhile() -> None:
        # A pod that starts (or loads) slower than the whole job takes: the first pod merged
        # and left while this one waited for its store.
        if not layout.hosts_store and merged():
            raise NothingLeft(gone)

    try:
        client = None
        if layout.writes_images or layout.hosts_store:
            client = claims.ClaimClient(host, port, chunks.NAMESPACE, on_outage=merged_meanwhile)
    except BaseException:
        if server is not None:  # nobody else holds it yet
            server.close()
        raise
    return server, client
