"""The work plan (chunks of rows), claimed and static chunk streams, seeds and the layout."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from muralist_api.items import item_seed, row_items
from muralist_api.job import Generation
from muralist_runtime.render import claim_loop
from muralist_runtime.work import chunks, item_failures
from muralist_runtime.work.item_failures import JobTally
from muralist_runtime.world import drain
from muralist_runtime.world.distributed import Layout

from tests.builders import make_job


def plan_for(rows: int, processes: int = 1, nodes: int = 1, **output) -> chunks.WorkPlan:
    job = make_job().world(nodes=nodes, gpus=0, processes=processes).output(**output).job()
    return chunks.make_plan(job.spec, rows, 0)


@pytest.mark.parametrize(
    ("rows", "processes", "nodes", "chunk_rows", "chunks"),
    [
        (3, 2, 1, 1, 3),  # a few rows: one per chunk, so the counter can balance them
        (40, 2, 1, 2, 20),  # 16 chunks per group at most, of whole rows
        (1_000_000, 8, 4, 32, 31_250),  # a big data set: small chunks all the same
        (0, 1, 1, 1, 0),
    ],
)
def test_plan_cuts_rows_into_small_chunks(rows: int, processes: int, nodes: int, chunk_rows: int,
                                           chunks: int) -> None:
    plan = plan_for(rows, processes, nodes)
    assert (plan.chunk_rows, plan.chunks) == (chunk_rows, chunks)
    covered = [r for c in range(plan.chunks) for r in range(*plan.bounds(c))]
    assert covered == list(range(rows)), "every row in exactly one chunk, in order"


@pytest.mark.parametrize(("rows", "batch", "per_prompt", "chunk_rows"), [
    (800, 4, 1, 28),  # 25 rows a chunk would leave a batch of 1 in each: 28 fill 7 batches
    (800, 1, 1, 25),  # one item a call: nothing to fill
    (3, 4, 1, 4),  # fewer rows than a batch: one batch's rows
    (2000, 3, 1, 30),  # 32 rows a chunk at most: the largest multiple of 3 below
    (800, 4, 2, 26),  # 2 items a row: 2 rows fill a batch
    (100, 64, 1, 64),  # a batch larger than a chunk: one batch a chunk
])
def test_chunks_hold_whole_batches(rows: int, batch: int, per_prompt: int, chunk_rows: int) -> None:
    job = make_job().world(nodes=1, gpus=0, processes=2).generation(batchSize=batch, imagesPerPrompt=per_prompt).job()
    plan = chunks.make_plan(job.spec, rows, 0)
    assert plan.chunk_rows == chunk_rows
    assert (plan.chunk_rows * per_prompt) % batch == 0


def test_webdataset_chunks_are_shards() -> None:
    plan = plan_for(2500, 2, layout="webdataset", shardSize=1000)
    assert (plan.chunk_rows, plan.chunks, plan.bounds(2)) == (1000, 3, (2000, 2500))


def test_a_row_range_is_planned_in_the_source_numbering() -> None:
    job = make_job().job()
    plan = chunks.make_plan(job.spec, rows=10, start=100)
    assert plan.bounds(0)[0] == 100 and plan.bounds(plan.chunks - 1)[1] == 110


@pytest.mark.parametrize(("chunk_count", "groups"), [(7, 3), (3, 2), (1, 4), (10, 1)])
def test_static_shares_are_contiguous_balanced_and_exact(chunk_count: int, groups: int) -> None:
    plan = chunks.WorkPlan(0, chunk_count, 1, 1)
    shares = [[c for c, _ in chunks.static_chunks(plan, g, groups)] for g in range(groups)]
    assert [c for share in shares for c in share] == list(range(chunk_count))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_own_chunks_first_then_claims_then_a_sweep_of_what_nobody_holds() -> None:
    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    plan = chunks.WorkPlan(0, 8, 1, 1)
    with ClaimServer(0) as server, ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) as store:
        # Before this group's pod was retried it owned chunk 1 (unfinished). Group 1 claimed 0, 2
        # and 3 (still rendering 3); chunk 4's claim reply was lost, so nobody owns it.
        for chunk, owner in ((0, 1), (1, 0), (2, 1), (3, 1), (4, None)):
            assert store.next_chunk() == chunk
            if owner is not None:
                store.add(f"owner/{chunk}", owner + 1)
                store.append(f"owned/{owner}", f"{chunk},")
        # Chunks 0, 2 and 7 are counted finished in this store's life (`done`).
        got = list(chunks.dynamic_chunks(store, plan, {0, 2, 7}.__contains__, group=0))
    assert got == [(1, False), (5, False), (6, False), (7, False), (4, True)]
    # The sweep takes only chunk 4: 0 and 2 are finished, 3 is group 1's (in flight), 1, 5, 6 and 7 group 0's.


def test_tally_counts_each_chunk_once_and_waits_for_all() -> None:
    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    with ClaimServer(0) as server, ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) as store:
        tally = chunks.Tally(store, counts_of=lambda c: (0, 2, ["00001-000: NaN", "00001-001: NaN"]))
        assert tally.finished(0, 3, 1, ["00000-000 (a): missing"]) == JobTally(chunks=1, completed=3, failed=1)
        assert tally.finished(0, 3, 1) == JobTally(1, 3, 1), "a duplicate of chunk 0 is not counted again"
        tally.count(1)
        tally.count(1)
        assert (store.add("done", 0), store.add("completed", 0), store.add("failed", 0)) == (2, 3, 3)
        assert tally.first_failures() == ["00000-000 (a): missing", "00001-000: NaN", "00001-001: NaN"]
        tally.finished(2, 0, 1, ["00002-000: NaN"])
        assert len(tally.first_failures()) == 3, "the first ones only"
        tally.wait_all(2)  # returns at once: both chunks are finished


class Clock:
    """A clock that each wait moves on, and that may finish chunks at set times."""

    def __init__(self, step: float, finish_at: dict[float, Any] | None = None) -> None:
        self.now, self.step, self.finish_at = 0.0, step, finish_at or {}

    def sleep(self, _seconds: float) -> None:
        self.now += self.step
        if self.now in self.finish_at:
            self.finish_at.pop(self.now)()


def test_the_merge_wait_ends_naming_the_chunks_not_done_and_who_holds_them() -> None:
    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    with ClaimServer(0) as server, ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) as store:
        tally = chunks.Tally(store)
        tally.finished(0, 1, 0)
        for chunk, group in ((1, 3), (2, None), (3, 0), (4, 1)):
            if group is not None:
                store.add(f"owner/{chunk}", group + 1)
        # Chunk 4 finishes 15 s in: the bound (20 s) counts again from there.
        clock = Clock(5.0, {15.0: lambda: tally.finished(4, 1, 0)})
        with pytest.raises(chunks.MergeWaitTimeout) as failed:
            tally.wait_all(5, bound=20, holder=lambda group: f"pod {group // 2}", clock=lambda: clock.now,
                           sleep=clock.sleep)
    assert clock.now == 35.0
    assert str(failed.value) == (
        "the merge waited 20s with no chunk finished (parallelism.collectiveTimeoutSeconds): 3 of 5 chunks not "
        "done: 1 (pod 1), 2 (held by nobody), 3 (pod 0); failing this pod, so that its retry claims them again")


@pytest.mark.parametrize(
    ("chunk_rows", "images", "slowest", "bound"),
    [(8, 1, 0.5, 600), (8, 2, 0.0, 600), (4, 2, 30.0, 960), (1, 1, 200.0, 800)],
    ids=["fast-images", "nothing-rendered-here", "slow-images", "one-slow-video"],
)
def test_merge_wait_bound(chunk_rows: int, images: int, slowest: float, bound: float) -> None:
    # At least the collective timeout; else 4 whole chunks at the slowest item seen here.
    assert chunks.merge_wait_bound(chunks.WorkPlan(0, 100, chunk_rows, images), 600, slowest) == bound


def test_seeds_do_not_depend_on_the_world() -> None:
    gen = Generation(images_per_prompt=3, seed=10)
    items = row_items(4, "p", gen) + row_items(5, "q", gen, seed=99)
    assert [i.seed for i in items] == [22, 23, 24, 99, 100, 101]
    assert [i.key for i in items[:2]] == ["00004-000", "00004-001"]
    assert items[4].number(3) == 16
    assert item_seed(0, None, 0, 0, 1) == 0


def layout(pod: int, local: int, ppn: int, nodes: int, group: int) -> Layout:
    pods = max(1, group // ppn)
    node_rank = pod % pods
    return Layout(pod_index=pod, local_rank=local, local_world_size=ppn, nodes=nodes, group_size=group,
                  pg_rank=node_rank * ppn + local, pg_size=pods * ppn)


@pytest.mark.parametrize(
    ("ppn", "nodes", "group"),
    [(1, 4, 1), (2, 3, 1), (4, 2, 2), (2, 4, 4), (8, 2, 16)],  # DP; DP x CP in a pod; CP over 2 pods
)
def test_job_ranks_and_groups_do_not_depend_on_the_world(ppn: int, nodes: int, group: int) -> None:
    layouts = [layout(p, r, ppn, nodes, group) for p in range(nodes) for r in range(ppn)]
    assert [lay.rank for lay in layouts] == list(range(nodes * ppn)), "pod index x per pod + local rank"
    for lay in layouts:
        assert lay.group_index == lay.rank // group and lay.dp_degree == nodes * ppn // group
        assert lay.pg_group_first == lay.pg_rank - lay.group_rank
    assert [lay.hosts_store for lay in layouts].count(True) == 1


def test_a_cpu_job_stays_on_the_cpu_and_gpus_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from muralist_api.contract import PermanentFailure
    from muralist_runtime.world import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert distributed.uses_gpu(make_job().world(gpus=0, processes=2).job().spec.parallelism) is False
    assert distributed.uses_gpu(make_job().world(gpus=1).job().spec.parallelism) is True
    with pytest.raises(PermanentFailure, match=r"^spec.parallelism.gpusPerNode: 2 processes per pod, one per GPU, "
                                               r"but this pod sees 1 GPU"):
        distributed.check_devices(layout(0, 0, 2, 1, 1))


class GroupOfTwo:
    """share_in_group for a group of two ranks, played from one side: the first rank's values
    are recorded (what the other rank would receive); the other rank is handed `incoming`."""

    def __init__(self, first: bool, incoming: list[object] | None = None, pod_index: int = 1) -> None:
        # By default not the first pod's: a group that does not stay for handed-back chunks.
        self.layout = SimpleNamespace(writes_images=first, group_index=0, pod_index=pod_index, group_size=2)
        self.shared: list[object] = []
        self.incoming = list(incoming or [])

    def share_in_group(self, value: object) -> object:
        if self.layout.writes_images:
            self.shared.append(value)
            return value
        return self.incoming.pop(0)


@pytest.mark.parametrize(("stop", "marker", "told"), [
    (chunks.NothingLeft("the job was merged and its first pod is gone"), chunks.NOTHING_LEFT,
     "first rank found the job merged"),
    (drain.Drained("stopped before claiming more work"), claim_loop.DRAINED, "first rank stopped claiming"),
], ids=["job-over", "drained"])
def test_a_group_ends_together_when_its_first_rank_stops(monkeypatch: pytest.MonkeyPatch, stop: Exception,
                                                         marker: str, told: str) -> None:
    def claims_then_stops(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        yield 0, False
        raise stop

    monkeypatch.setattr(chunks, "dynamic_chunks", claims_then_stops)
    job = SimpleNamespace(work=plan_for(4))
    first = GroupOfTwo(first=True)
    with pytest.raises(type(stop)):
        list(claim_loop.chunk_stream(job, SimpleNamespace(world=first, claims=None)))
    assert first.shared == [(0, False), marker]  # the other rank is told, not left in the collective
    other = GroupOfTwo(first=False, incoming=first.shared)
    stream = claim_loop.chunk_stream(job, SimpleNamespace(world=other, claims=None))
    assert next(stream) == (0, False)
    with pytest.raises(type(stop), match=told):
        next(stream)


def chunks_of(stream: Any) -> Any:
    """dynamic_chunks' chunks, without the heartbeats it yields while it stays (LINGERING)."""
    return (step for step in stream if step[0] != chunks.LINGERING)


def test_a_group_of_two_in_the_first_pod_stays_together_for_handed_back_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    stays: dict[str, Any] = {}

    def staying(*args: object, **kwargs: Any):  # type: ignore[no-untyped-def]
        stays.update(kwargs)
        yield chunks.LINGERING, False
        yield chunks.LINGERING, False
        yield 3, True

    monkeypatch.setattr(chunks, "dynamic_chunks", staying)
    job = SimpleNamespace(work=plan_for(4), runtime=make_job().job())
    first = GroupOfTwo(first=True, pod_index=0)
    state = SimpleNamespace(world=first, claims=None, progress=SimpleNamespace(idle=lambda _idle: None))
    assert list(claim_loop.chunk_stream(job, state)) == [(3, True)]
    assert stays["linger"] == 600, "a group of two ranks stays, as long as a collective may wait"
    assert first.shared == [(chunks.LINGERING, False), (chunks.LINGERING, False), (3, True), None]
    other = GroupOfTwo(first=False, incoming=first.shared, pod_index=0)
    assert list(claim_loop.chunk_stream(job, SimpleNamespace(world=other, claims=None))) == [(3, True)], \
        "the other rank waits on with its first rank, then renders the chunk it took"


def test_a_chunk_handed_back_late_is_taken_by_a_group_that_stays() -> None:
    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    plan = chunks.WorkPlan(0, 3, 1, 1)
    with ClaimServer(0) as server, ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) as store:
        # Group 1 claimed chunk 2 and is still on it when group 0 has swept everything else.
        for chunk, owner in ((0, 0), (1, 0), (2, 1)):
            assert store.next_chunk() == chunk
            assert chunks._take(store, chunk, owner)
        tally = chunks.Tally(store)
        tally.finished(0, 1, 0)
        tally.finished(1, 1, 0)
        done = {0, 1}
        clock = Clock(1.0, {3.0: lambda: chunks.release(store, 2, group=1)})  # group 1 drains
        idle: list[bool] = []
        stream = chunks.dynamic_chunks(store, plan, done.__contains__, group=0, tally=tally, linger=30.0,
                                       clock=lambda: clock.now, sleep=clock.sleep, idle=idle.append)
        assert next(stream) == (chunks.LINGERING, False), "while it stays, it tells its group to wait on"
        assert next(chunks_of(stream)) == (2, True), "the handed-back chunk is taken"
        assert idle == [True, False], "quiet by right while it waits, rendering again when it takes one"
        assert chunks.owner(store, 2) == 0, "and owned by group 0 now"
        done.add(2)
        tally.finished(2, 1, 0)
        assert list(chunks_of(stream)) == [], "every chunk finished: the group stops staying"
        assert idle == [True, False, True]
        # A group that did not stay (or a drained pod's retry) finds nothing of it left to take.
        assert not chunks.release(store, 2, group=1), "a stale hand-back changes nothing: group 0 holds it"
        assert chunks.owner(store, 2) == 0
        with pytest.raises(drain.Drained):
            next(chunks.dynamic_chunks(store, chunks.WorkPlan(0, 4, 1, 1), done.__contains__, group=1,
                                       stop=lambda: True))


def test_staying_ends_when_no_chunk_finishes_for_its_bound() -> None:
    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    plan = chunks.WorkPlan(0, 2, 1, 1)
    with ClaimServer(0) as server, ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) as store:
        for chunk in range(2):
            store.next_chunk()
            store.add(f"owner/{chunk}", 2)  # group 1 holds both, and is hung
        clock = Clock(5.0)
        got = list(chunks_of(chunks.dynamic_chunks(store, plan, lambda c: False, group=0, linger=20.0,
                                                   clock=lambda: clock.now, sleep=clock.sleep)))
    assert got == [] and clock.now == 20.0, "the merge's own bound then names the missing chunks"


def test_a_drained_pods_retry_takes_back_its_handed_back_chunk_unless_taken() -> None:
    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    plan = chunks.WorkPlan(0, 3, 1, 1)
    with ClaimServer(0) as server, ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) as store:
        for chunk in range(3):
            store.next_chunk()
            store.add(f"owner/{chunk}", 1)
            store.append("owned/0", f"{chunk},")
        chunks.release(store, 1, group=0)
        chunks.release(store, 2, group=0)
        store.add("owner/2", 2)  # group 1 took chunk 2 since
        got = list(chunks.dynamic_chunks(store, plan, {0}.__contains__, group=0))
    assert got == [(1, False)], "chunk 1 is taken back, chunk 2 is group 1's now"


# -- the store's decisions under lost replies and races ----------------------------------------------


def lossy_client(proxy: Any) -> Any:
    """A client through `proxy` that reconnects at once after a lost reply (claims.ClaimClient retries)."""
    from muralist_runtime.work.claims import ClaimClient

    return ClaimClient("127.0.0.1", proxy.port, chunks.NAMESPACE, connect_timeout_s=5, backoff_s=(0.01, 0.05))


# The store operations with a reply that Tally.finished makes, in order (an append gets none): the
# compare-and-set that picks who counts the chunk, the failed total, the completed total, the chunks.
FINISHING_OPS = ["counted", "failed", "completed", "done"]


@pytest.mark.parametrize("lost", range(len(FINISHING_OPS)), ids=FINISHING_OPS)
def test_a_lost_reply_never_counts_a_chunk_twice(lost: int) -> None:
    from muralist_api.pods import RunPolicy
    from muralist_runtime.work.claims import ClaimServer

    from tests.tcp_proxy import TcpProxy

    policy = RunPolicy(maxFailedItems=1)  # one failed item is allowed, two fail the job
    with ClaimServer(0) as server, TcpProxy(("127.0.0.1", server.port)) as proxy, lossy_client(proxy) as store:
        tally = chunks.Tally(store)
        tally.hints()  # connected: from here on, one reply per operation
        proxy.lose_reply(after=lost)
        counted = tally.finished(0, 3, 1, ["00000-001: NaN"])
        assert proxy.lost == 1 and store.reconnects == 1, "the reply was lost, the operation sent again"
        assert tally.exact() == JobTally(chunks=1, completed=3, failed=1)
        assert tally.records() == {0: (3, 1)}
        assert tally.first_failures() == ["00000-001: NaN"]
        assert tally.verdict(counted, policy, total=100) is None, "one failed item is not two"
        tally.finished(0, 3, 1, ["00000-001: NaN"])  # a duplicate writer of chunk 0: not counted again
        assert tally.exact() == JobTally(chunks=1, completed=3, failed=1)
        tally.wait_all(1)  # returns at once: the one chunk is finished
        if FINISHING_OPS[lost] == "failed":
            # What the running total alone would have decided: the add was applied twice.
            assert tally.hints().failed == 2
            assert item_failures.chunk_verdict(tally.hints(), policy, total=100) is not None


@pytest.mark.parametrize("lost", ["take", "release"])
def test_owning_and_handing_back_survive_a_lost_reply(lost: str) -> None:
    from muralist_runtime.work.claims import ClaimServer

    from tests.tcp_proxy import TcpProxy

    with ClaimServer(0) as server, TcpProxy(("127.0.0.1", server.port)) as proxy, lossy_client(proxy) as store:
        assert chunks.owner(store, 5) is None
        if lost == "take":
            proxy.lose_reply()
        assert chunks._take(store, 5, group=2), "a retried compare-and-set finds its own number: it won"
        assert chunks.owner(store, 5) == 2
        assert not chunks._take(store, 5, group=3), "and nobody else takes it"
        if lost == "release":
            proxy.lose_reply()
        assert chunks.release(store, 5, group=2)
        assert chunks.owner(store, 5) is None
        assert [c for c in store.text("released").split(",") if c] == ["5"]
        assert proxy.lost == 1
        assert chunks._take(store, 5, group=3), "a handed-back chunk is taken again"
        assert not chunks.release(store, 5, group=2), "a stale hand-back is refused: group 3 holds it"
        assert chunks.owner(store, 5) == 3


def test_two_groups_racing_for_a_handed_back_chunk_leave_one_owner_that_can_hand_it_back() -> None:
    import threading

    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    with ClaimServer(0) as server:
        clients = [ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) for _ in range(2)]
        try:
            for chunk in range(200):
                start = threading.Barrier(2)
                won: list[int] = []

                def race(group: int, chunk: int = chunk, start: threading.Barrier = start,
                         won: list[int] = won) -> None:
                    start.wait()
                    if chunks._take(clients[group], chunk, group):
                        won.append(group)

                if chunk % 2:  # handed back: "0", as a release leaves it; else never owned: ""
                    clients[0].add(f"owner/{chunk}", 0)
                threads = [threading.Thread(target=race, args=(g,)) for g in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert len(won) == 1, f"chunk {chunk}: {len(won)} owners"
                assert chunks.owner(clients[0], chunk) == won[0]
                assert chunks.release(clients[won[0]], chunk, won[0]), "the winner can hand it back"
                assert chunks._take(clients[1 - won[0]], chunk, 1 - won[0]), "and the other can take it then"
        finally:
            for client in clients:
                client.close()


def test_a_counted_chunk_whose_entry_was_lost_is_put_back_by_the_merges_wait() -> None:
    from muralist_runtime.work.claims import ClaimClient, ClaimServer

    with ClaimServer(0) as server, ClaimClient("127.0.0.1", server.port, chunks.NAMESPACE) as store:
        tally = chunks.Tally(store, counts_of=lambda c: (2, 0, []))
        tally.finished(0, 2, 0)
        send = store.append
        store.append = lambda name, text: None  # type: ignore[method-assign]  # chunk 1's entry is lost
        tally.finished(1, 2, 0)
        store.append = send  # type: ignore[method-assign]
        assert tally.records() == {0: (2, 0)} and tally.hints().chunks == 2
        waits: list[float] = []
        tally.wait_all(2, bound=60, sleep=waits.append)
        assert tally.records() == {0: (2, 0), 1: (2, 0)}
        assert len(waits) == 1, "put back at once: every chunk was counted"
