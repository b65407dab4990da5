"""This rank's link to the claim store: who hosts it, who gets a client, and a retried pod of a
merged job that finds nothing left (real TCPStores on 127.0.0.1)."""

from __future__ import annotations

import pytest
from muralist_api import contract
from muralist_runtime.work import store
from muralist_runtime.work.chunks import NothingLeft
from muralist_runtime.world.distributed import Layout

from tests.operator_helpers import free_port

pytest.importorskip("torch.distributed")


def layout(pod_index: int, local_rank: int, group_size: int = 1) -> Layout:
    return Layout(pod_index=pod_index, local_rank=local_rank, local_world_size=2, nodes=2, group_size=group_size,
                  pg_rank=local_rank, pg_size=2)


@pytest.fixture
def address(monkeypatch: pytest.MonkeyPatch) -> int:
    port = free_port()
    monkeypatch.setenv(contract.MURALIST_CLAIMS_ADDR, f"127.0.0.1:{port}")
    return port


def test_the_first_pods_first_rank_hosts_the_store_and_writers_claim_from_it(address: int) -> None:
    server, client = store.connect(layout(0, 0), merged=lambda: False, root="/out")
    assert server is not None and client is not None
    try:
        assert client.reachable(5)
        silent_rank, none = store.connect(layout(0, 1, group_size=2), merged=lambda: False, root="/out")
        assert (silent_rank, none) == (None, None), "a group's second rank neither hosts nor writes"
    finally:
        client.close()
        server.close()


def test_a_pod_retried_after_the_merge_finds_nothing_left(address: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "STORE_PROBE_SECONDS", 0.2)
    with pytest.raises(NothingLeft, match="the job was merged in /out and its first pod is gone"):
        store.connect(layout(1, 0), merged=lambda: True, root="/out")
