"""Who renders what: chunks of rows, claimed from a shared counter instead of fixed shards.

A fixed shard plan makes the slowest GPU set the job's end. Here the rows are cut into chunks
(`WorkPlan`) and every data-parallel group (a rank, or a CP/TP group's first rank, which shares
the chunk with its group) claims the next chunk from a counter in the work-claim store that the
job's first pod hosts (claims.py), across pods too: a slow GPU or a slow pod simply takes fewer.

Each claim is recorded in the store: the chunk's owner, and the list of chunks a group owns.
A pod that failed and is retried finds its groups' chunks there and finishes those not finished
before claiming new ones. When the counter runs past the end, each group sweeps the
chunks once more and takes any that is neither done nor owned: a claim whose reply was lost,
or one claimed before the store restarted. Two groups on one chunk (a rare race, or a store
restart) render an item at most twice and write it idempotently. Seeds are a function of the
item only, so which group renders an item never changes its pixels.

The store also counts finished chunks, completed and failed items (item_failures.py decides
from them when failed items fail the job); the first pod's first rank waits until every chunk
is finished, then merges the outputs (merge.py). If the first pod restarts, the store starts
from zero: every chunk is claimed again, and chunks done on disk are counted and skipped at once.
That wait has a bound (`merge_wait_bound`): when no chunk of the job finishes for that long, the
first pod fails (retryable) naming the chunks not done and who holds them, and its retry, with a
new store, claims them again.

Every store operation may be applied twice: the client retries one whose reply was lost
(claims.py), though the server had applied it. So what decides is written to be idempotent:
- ownership is one compare-and-set from a free state ("" never owned, "0" handed back) to the
  group's number; a retried one finds its own number and knows it won. A release is a
  compare-and-set from the group's number back to "0", and says whether it happened.
- a finished chunk is counted once: a compare-and-set of `counted/<chunk>` to a token of the
  call picks the one call that counts it, and the chunk goes into `finished`, a set (entries
  `<chunk>:<completed>:<failed>,` appended, read back deduplicated by chunk): the merge's wait and
  any failure of the job are decided from that set. The running totals (`done`, `completed`,
  `failed`, plain adds) are hints that a lost reply may inflate: a verdict they give is checked
  against the set before it fails a job. An append gets no reply, so one can be lost with its
  connection: the merge's wait puts a counted chunk missing from the set back from its part file.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from muralist_api import contract
from muralist_api.contract.env import PodEnv
from muralist_api.job import DiffusionJobSpec
from muralist_api.pods import RunPolicy

from ..world import drain
from . import item_failures
from .claims import ClaimClient
from .item_failures import JobTally

log = logging.getLogger("muralist.work")

# Small chunks balance better and cost one claim (tens of microseconds) each: at the end of a
# job the slowest group may still take one last chunk, so a job of G groups waits for about
# 1 / (CHUNKS_PER_GROUP) of a group's work at worst (measured: 4 per group left 2 ranks, one
# half as fast, at 1.10-1.24x of ideal; a simulation gives 1.03x at 16).
CHUNKS_PER_GROUP = 16
MAX_CHUNK_ROWS = 32
NAMESPACE = "work"
# How often a wait for other groups' chunks looks again (a lingering group, the merge): at the end of a job
# every group but the last waits, so a second here was up to a second more of the whole job (a few store reads
# a poll, on the first pod).
WAIT_SECONDS = 0.1
# What a group's first rank shares instead of a chunk when it found the job over (NothingLeft).
NOTHING_LEFT = "nothing-left"
# What dynamic_chunks yields instead of a chunk, about once a WAIT_SECONDS, while it stays for
# handed-back chunks: a group's other ranks wait for their next chunk in a collective with a timeout.
LINGERING = -1
# The set of finished chunks (see the module's docstring) and the key that picks who counts a chunk.
FINISHED = "finished"
COUNTED = "counted"


# The merge waits at least this many times as long as the slowest chunk could take here.
MERGE_WAIT_MULTIPLE = 4


class NothingLeft(Exception):
    """The job is complete: this process ends with exit 0 without rendering."""


class MergeWaitTimeout(RuntimeError):
    """No chunk finished anywhere for the merge's bound (a retryable failure of the first pod)."""


@dataclass(frozen=True)
class WorkPlan:
    start: int  # the source's first row
    rows: int
    chunk_rows: int
    images_per_prompt: int

    @property
    def chunks(self) -> int:
        return math.ceil(self.rows / self.chunk_rows) if self.rows else 0

    @property
    def total_items(self) -> int:
        return self.rows * self.images_per_prompt

    def bounds(self, chunk: int) -> tuple[int, int]:
        """The rows [begin, end) of a chunk, in the source's numbering."""
        begin = self.start + chunk * self.chunk_rows
        return begin, min(begin + self.chunk_rows, self.start + self.rows)


def make_plan(spec: DiffusionJobSpec, rows: int, start: int) -> WorkPlan:
    """The same plan in every pod: it depends on the spec and the source only."""
    par = spec.parallelism
    if spec.output.layout == "webdataset":
        chunk_rows = spec.output.shard_size  # one shard per chunk
    else:
        groups = max(1, par.world_size // par.group_size)
        chunk_rows = whole_batches(max(1, min(MAX_CHUNK_ROWS, math.ceil(rows / (groups * CHUNKS_PER_GROUP)))),
                                   spec.generation.batch_size, spec.generation.images_per_prompt)
    return WorkPlan(start, rows, chunk_rows, spec.generation.images_per_prompt)


def whole_batches(chunk_rows: int, batch_size: int, images_per_prompt: int) -> int:
    """`chunk_rows` moved to the nearest count whose items fill whole batches (render/batching.py pads a short
    batch), up to MAX_CHUNK_ROWS unless one batch's rows are more."""
    step = batch_size // math.gcd(batch_size, images_per_prompt)  # rows whose items fill whole batches
    if step == 1:
        return chunk_rows
    up = math.ceil(chunk_rows / step) * step
    return up if up <= max(MAX_CHUNK_ROWS, step) else MAX_CHUNK_ROWS // step * step


def merge_wait_bound(plan: WorkPlan, floor: float, slowest_item_seconds: float) -> float:
    """How long the merge waits with no chunk finished anywhere: MERGE_WAIT_MULTIPLE x a whole
    chunk at the slowest item this pod rendered, and at least `floor`
    (parallelism.collectiveTimeoutSeconds: what the job grants a stuck rank)."""
    return max(floor, MERGE_WAIT_MULTIPLE * plan.chunk_rows * plan.images_per_prompt * slowest_item_seconds)


def claims_address(env: dict[str, str] | None = None) -> tuple[str, int]:
    value = PodEnv.from_environ(env).claims_addr or f"127.0.0.1:{contract.CLAIMS_PORT}"
    host, _, port = value.rpartition(":")
    return host or "127.0.0.1", int(port)


def owner(client: ClaimClient, chunk: int) -> int | None:
    """The group that owns a chunk, or None."""
    value = client.add(f"owner/{chunk}", 0)
    return value - 1 if value else None


def _take(client: ClaimClient, chunk: int, group: int) -> bool:
    """Own a chunk that nobody owns (a fresh claim, a lost one, one handed back): one compare-and-set
    from its free state, "" (never owned) or "0" (handed back), to this group's number."""
    mine = str(group + 1)
    now = client.compare_set(f"owner/{chunk}", "", mine)
    if now == "0":
        now = client.compare_set(f"owner/{chunk}", "0", mine)
    return now == mine


def release(client: ClaimClient, chunk: int, group: int) -> bool:
    """Hand an unfinished chunk back (a drained group): nobody owns it, and it is listed for the
    groups that stay until the end (`dynamic_chunks(linger=...)`). False when the chunk was not this
    group's (another group took it meanwhile): nothing is handed back."""
    now = client.compare_set(f"owner/{chunk}", str(group + 1), "0")
    if now != "0":
        log.warning("chunk %d is group %s's, not group %d's: not handed back", chunk, int(now or 1) - 1, group)
        return False
    client.append("released", f"{chunk},")
    return True


def dynamic_chunks(client: ClaimClient, plan: WorkPlan, done: Callable[[int], bool], group: int,
                   tally: Tally | None = None, *, linger: float = 0.0,
                   stop: Callable[[], bool] = lambda: False,
                   idle: Callable[[bool], None] = lambda _idle: None,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Iterator[tuple[int, bool]]:
    """(chunk, sweeping) for one group: its own unfinished chunks, claimed ones, then a sweep.

    `done`: whether a chunk is finished in this store's life (Tally.counted); a chunk with a part file on
    disk is not done until the group that takes it has checked it was made for this request.
    `linger` (the first pod's groups): after the sweep, stay until every chunk is
    finished and take the chunks that drained groups hand back after the others' sweeps passed
    them; stop staying once no chunk has finished anywhere for `linger` seconds (the merge's own
    bound then names what is missing); `idle` says when it waits there (quiet by right: no stall)
    and when it renders again. `stop`: this pod was told to drain; raises drain.Drained instead of
    claiming."""
    def claimable() -> bool:
        if stop():
            raise drain.Drained("stopped before claiming more work")
        return True

    owned = [int(c) for c in client.text(f"owned/{group}").split(",") if c]
    for chunk in dict.fromkeys(owned):  # claimed by this group before its pod was retried
        # Still this group's, or handed back and not taken since (a drained pod started again).
        if not done(chunk) and claimable() and (owner(client, chunk) == group or _take(client, chunk, group)):
            yield chunk, False
    while claimable() and (chunk := client.next_chunk()) < plan.chunks:
        if not _take(client, chunk, group):
            continue  # a sweeping group took it between the claim and this: it renders it
        client.append(f"owned/{group}", f"{chunk},")
        yield chunk, False
    for i in range(plan.chunks):
        chunk = (group + i) % plan.chunks
        if not done(chunk) and claimable() and owner(client, chunk) is None and _take(client, chunk, group):
            yield chunk, True
    seen, last, since = 0, -1, clock()
    if linger:
        idle(True)
    while linger and (finished := _finished_count(client, tally)) < plan.chunks:
        if finished != last:
            last, since = finished, clock()
        elif clock() - since >= linger:
            return
        released = [int(c) for c in client.text("released").split(",") if c]
        for chunk in released[seen:]:
            if not done(chunk) and claimable() and _take(client, chunk, group):
                idle(False)
                yield chunk, True
                idle(True)
        seen = len(released)
        claimable()
        sleep(WAIT_SECONDS)
        yield LINGERING, False  # the group's other ranks wait in a collective: tell them to go on waiting


def _finished_count(client: ClaimClient, tally: Tally | None) -> int:
    return len(tally.records()) if tally is not None else client.add("done", 0)


def static_chunks(plan: WorkPlan, group: int, groups: int) -> Iterator[tuple[int, bool]]:
    """A fixed contiguous share per group, as accelerate's split_between_processes would give
    (MURALIST_TEST_STATIC_PLAN: the benchmark's comparison, not for jobs)."""
    base, extra = divmod(plan.chunks, groups)
    first = group * base + min(group, extra)
    for chunk in range(first, first + base + (1 if group < extra else 0)):
        yield chunk, False


# A finished chunk's items: completed (rendered or kept), failed, and the failed ones described.
ChunkCounts = tuple[int, int, list[str]]


class Tally:
    """The store's job-wide counts: the set of finished chunks with their items (exact), and the
    running totals of chunks, completed and failed items (hints: see the module's docstring), and
    the first failed items described (item_failures applies its rules to them)."""

    def __init__(self, client: ClaimClient, counts_of: Callable[[int], ChunkCounts] | None = None):
        self.client = client
        self.counts_of = counts_of  # a finished chunk's counts, from its part file

    def finished(self, chunk: int, completed: int, failed: int, failures: list[str] | None = None) -> JobTally:
        """Count a finished chunk once per store life; returns the job's counts so far (hints)."""
        token = uuid.uuid4().hex
        if self.client.compare_set(f"{COUNTED}/{chunk}", "", token) != token:
            return self.hints()  # counted already (by a duplicate writer, or before a retried pod)
        self.client.append(FINISHED, f"{chunk}:{completed}:{failed},")
        failed_total = self.client.add("failed", failed)
        if failures and failed_total - failed < item_failures.NAMED:
            self.client.append("failures", "".join(f"{line}\n" for line in failures[:item_failures.NAMED]))
        # Completed before done: whoever counts the K-th chunk sees the completed items of all K.
        completed_total = self.client.add("completed", completed)
        chunks = self.client.add("done", 1)
        if completed_total == 0:
            completed_total = self.client.add("completed", 0)
        return JobTally(chunks, completed_total, failed_total)

    def verdict(self, counted: JobTally, policy: RunPolicy, total: int) -> item_failures.FailureVerdict | None:
        """item_failures' verdict as a chunk ends (`counted`: what `finished` returned): a failure the running
        totals show is confirmed by the set of finished chunks, since a lost reply may have inflated them."""
        if item_failures.chunk_verdict(counted, policy, total) is None:
            return None
        return item_failures.chunk_verdict(self.exact(), policy, total)

    def hints(self) -> JobTally:
        return JobTally(self.client.add("done", 0), self.client.add("completed", 0), self.client.add("failed", 0))

    def records(self) -> dict[int, tuple[int, int]]:
        """The finished chunks: chunk -> (completed, failed), each chunk once."""
        out: dict[int, tuple[int, int]] = {}
        for entry in self.client.text(FINISHED).split(","):
            if entry:
                chunk, completed, failed = (int(x) for x in entry.split(":"))
                out.setdefault(chunk, (completed, failed))
        return out

    def exact(self) -> JobTally:
        """The job's counts from the set of finished chunks: what a verdict that fails the job reads."""
        records = self.records()
        return JobTally(len(records), sum(c for c, _ in records.values()), sum(f for _, f in records.values()))

    def counted(self, chunk: int) -> bool:
        """Whether the chunk is finished in this store's life."""
        return bool(self.client.text(f"{COUNTED}/{chunk}"))

    def count(self, chunk: int) -> None:
        """Count a chunk found finished on disk, unless it is counted already."""
        if not self.counted(chunk):
            self.finished(chunk, *(self.counts_of(chunk) if self.counts_of else (0, 0, [])))

    def first_failures(self) -> list[str]:
        """The first failed items counted in this store's life, described (at most NAMED)."""
        lines = dict.fromkeys(line for line in self.client.text("failures").splitlines() if line)
        return list(lines)[:item_failures.NAMED]

    def wait_all(self, chunks: int, on_wait: Callable[[int], object] | None = None, bound: float | None = None,
                 holder: Callable[[int], str] = lambda group: f"group {group}",
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        """Until every chunk of the job is in the set of finished chunks (the first pod's merge waits for the
        others); MergeWaitTimeout once none has finished for `bound` seconds. `holder` names a group."""
        last, since = -1, clock()
        while (done := len(finished := self.records())) < chunks:
            if self.client.add("done", 0) >= chunks:
                self._heal(chunks, finished)  # every chunk counted, yet not every one in the set
            if drain.requested():
                raise drain.Drained(f"told to stop while waiting to merge ({done} of {chunks} chunks done); the "
                                    "first pod's next start merges")
            if on_wait is not None:
                on_wait(done)  # first: a stalled rank of this pod is the more precise cause
            if done != last:
                last, since = done, clock()
            elif bound is not None and clock() - since >= bound:
                if not self._heal(chunks, finished):
                    raise MergeWaitTimeout(self.missing(chunks, finished, clock() - since, holder))
                since = clock()
            sleep(WAIT_SECONDS)

    def _heal(self, chunks: int, finished: dict[int, tuple[int, int]]) -> bool:
        """Put into the set the chunks that were counted but are not in it, from their part files; whether
        any was. An append has no reply: one sent on a connection that broke before the server read it is
        lost, and so is the entry of a counter that stopped between the compare-and-set and the append."""
        healed = False
        for chunk in range(chunks):
            if chunk not in finished and self.counts_of is not None and self.client.text(f"{COUNTED}/{chunk}"):
                completed, failed, _ = self.counts_of(chunk)
                self.client.append(FINISHED, f"{chunk}:{completed}:{failed},")
                healed = True
        return healed

    def missing(self, chunks: int, finished: dict[int, tuple[int, int]], quiet: float, holder: Callable[[int], str],
                show: int = 5) -> str:
        """What the merge waited for: the first chunks not done, and the group holding each."""
        shown = []
        left = [chunk for chunk in range(chunks) if chunk not in finished]
        for chunk in left[:show]:
            group = owner(self.client, chunk)
            shown.append(f"{chunk} ({holder(group) if group is not None else 'held by nobody'})")
        more = f", and {len(left) - len(shown)} more" if len(left) > len(shown) else ""
        return (f"the merge waited {quiet:.0f}s with no chunk finished (parallelism.collectiveTimeoutSeconds): "
                f"{len(left)} of {chunks} chunks not done: {', '.join(shown)}{more}; failing this pod, so that its "
                "retry claims them again")
