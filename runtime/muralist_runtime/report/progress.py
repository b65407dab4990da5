"""Progress: a bar for people, JSON lines for machines, pushed counts for the operator.

- Every rank keeps its counts in a small JSON file in its pod's progress directory
  (`RankFile`, MURALIST_PROGRESS_DIR or /tmp/muralist-progress): what one pod's ranks have done,
  readable without a collective.
- The pod's first local rank sums those files and posts them to the operator (`PodReporter`,
  MURALIST_PROGRESS_URL) every few seconds and once at the end, over HTTPS with the pod's
  projected service-account token (re-read from its file on each post: the kubelet rotates
  it). The body, its path, the token's audience and the interval are the API's progress wire
  (muralist_api.contract.progress: `ProgressReport`). Generation never waits on it; errors
  are logged and ignored. Counts are cumulative for the pod, so a lost post loses nothing.
- `muralist run` sums the files of all its agents into one bar for the whole job.
- Pods: one line per finished item on stdout, `MURALIST_PROGRESS {json}`.
- Stall detection: each report carries `lastStepTime` (the last denoising step, from the
  pipeline's step callback, on every rank of a group) and `lastImageTime` (the last item on
  disk), and `done` once the pod's ranks have no more work: a done pod's silence is no stall.
"""

from __future__ import annotations

import datetime
import http.client
import json
import logging
import os
import ssl
import sys
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path

from muralist_api import contract
from muralist_api.contract import PROGRESS_LINE_PREFIX, Counts
from muralist_api.contract.env import PodEnv
from muralist_api.contract.progress import DEFAULT_POST_INTERVAL_SECONDS, ProgressReport

from ..outputs import temps

log = logging.getLogger("muralist.progress")

DEFAULT_PROGRESS_DIR = "/tmp/muralist-progress"
RANK_FILE_INTERVAL_SECONDS = 0.5
POST_TIMEOUT_SECONDS = 10.0


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def moment(text: str | None) -> datetime.datetime | None:
    """A time now_iso wrote (rank files keep them as text), for the report."""
    return None if text is None else datetime.datetime.fromisoformat(text)


@dataclass
class RankState:
    """What one rank has done: its counts, the job's total, and its last signs of progress."""

    counts: Counts = field(default_factory=Counts)
    job_total: int = 0
    last_step_time: str | None = None
    last_image_time: str | None = None
    done: bool = False

    def to_json(self) -> str:
        return json.dumps({**asdict(self.counts), "jobTotal": self.job_total, "lastStepTime": self.last_step_time,
                           "lastImageTime": self.last_image_time, "done": self.done})

    @classmethod
    def parse(cls, text: str) -> RankState:
        doc = json.loads(text)
        return cls(Counts(*(int(doc.get(k, 0)) for k in ("completed", "skipped", "failed", "total"))),
                   int(doc.get("jobTotal", 0)), doc.get("lastStepTime"), doc.get("lastImageTime"),
                   bool(doc.get("done")))


def progress_dir(env: dict[str, str] | None = None) -> Path:
    return Path(PodEnv.from_environ(env).progress_dir or DEFAULT_PROGRESS_DIR)


class RankFile:
    """This rank's state as `rank-<r>.json` in the pod's progress directory.

    Updates are cheap (a step calls one): a daemon thread writes the latest state at most every
    `interval`, atomically. Being a thread of its own, it also gets the last state out of a rank
    whose main thread hangs, so a stall shows as a stall (steps that stopped), not as a rank
    that never started.
    """

    def __init__(self, directory: Path, rank: int, interval: float = RANK_FILE_INTERVAL_SECONDS):
        self.path = directory / f"rank-{rank}.json"
        self.interval = interval
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: str | None = None
        self._stop = threading.Event()
        directory.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="muralist-rank-file", daemon=True)
        self._thread.start()

    def update(self, state: RankState, force: bool = False) -> None:
        text = state.to_json()
        if force:
            with self._lock:
                self._pending = None
            self._write(text)
            return
        with self._lock:
            self._pending = text

    def _write(self, text: str) -> None:
        try:
            with self._write_lock:  # a forced update and the thread's own: one temp name per process
                temps.write_atomic(self.path, text.encode(), fsync=False)
        except OSError as e:  # progress must never break generation
            log.warning("cannot write %s: %s", self.path, e)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                text, self._pending = self._pending, None
            if text is not None:
                self._write(text)

    def close(self) -> None:
        self._stop.set()


@dataclass
class PodState:
    """The sum of a pod's (or several pods') rank files."""

    counts: Counts = field(default_factory=Counts)
    ranks: int = 0
    last_step_time: str | None = None
    last_image_time: str | None = None
    done: bool = True


def read_pod(directories: list[Path]) -> PodState:
    """Sum every rank file in these directories (unreadable ones skipped); total = the job's."""
    pod = PodState()
    for directory in directories:
        for path in directory.glob("rank-*.json"):
            try:
                one = RankState.parse(path.read_text())
            except (OSError, ValueError, TypeError):
                continue  # a torn write: the next read has it
            pod.ranks += 1
            pod.counts.completed += one.counts.completed
            pod.counts.skipped += one.counts.skipped
            pod.counts.failed += one.counts.failed
            pod.counts.total = max(pod.counts.total, one.job_total)
            pod.last_step_time = max(filter(None, (pod.last_step_time, one.last_step_time)), default=None)
            pod.last_image_time = max(filter(None, (pod.last_image_time, one.last_image_time)), default=None)
            pod.done = pod.done and one.done
    pod.done = pod.done and pod.ranks > 0
    return pod


def read_counts(directories: list[Path]) -> Counts:
    return read_pod(directories).counts


class RankStalled(RuntimeError):
    """A rank of this pod stopped making progress: the pod fails (retryable) instead of hanging."""


def pending_ranks(directory: Path, timeout: float) -> int:
    """This pod's ranks not done yet; raise RankStalled when one of them has not moved (no step,
    no item: its rank file untouched) for `timeout` seconds."""
    pending = 0
    for path in sorted(directory.glob("rank-*.json")):
        try:
            state, moved = RankState.parse(path.read_text()), path.stat().st_mtime
        except (OSError, ValueError, TypeError):
            continue
        if state.done:
            continue
        pending += 1
        if (quiet := time.time() - moved) > timeout:
            raise RankStalled(f"{path.stem} of this pod made no progress for {quiet:.0f}s "
                              "(parallelism.collectiveTimeoutSeconds): failing the pod so it is retried")
    return pending


def wait_for_pod(directory: Path, timeout: float, poll: float = 1.0) -> None:
    """Until every rank of this pod says it is done (pending_ranks raises on a stalled one).

    Ranks of a pod share no collective at the end, so without this a hung rank would keep the
    pod alive, and the chunk it holds unfinished, forever.
    """
    while pending_ranks(directory, timeout):
        time.sleep(poll)


# -- pushing to the operator -------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    url: str
    token_file: str
    ca_file: str | None
    pod: str
    index: int
    attempt: int


def target_from_env(env: dict[str, str] | None = None) -> Target | None:
    """The operator's progress endpoint, as the pod contract gives it; None outside a pod."""
    pod = PodEnv.from_environ(env)
    if not pod.progress_url:
        return None
    return Target(url=pod.progress_url, token_file=pod.progress_token or contract.PROGRESS_TOKEN_FILE,
                  ca_file=pod.progress_ca, pod=pod.pod_name or os.uname().nodename, index=pod.pod_index,
                  attempt=pod.attempt)


class PodReporter:
    """Posts the pod's summed rank files from a daemon thread, over one kept-alive connection."""

    def __init__(self, target: Target, directory: Path, interval: float = DEFAULT_POST_INTERVAL_SECONDS):
        self.target, self.directory, self.interval = target, directory, interval
        self._url = urllib.parse.urlsplit(target.url)
        self._conn: http.client.HTTPConnection | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="muralist-progress", daemon=True)
        self.sent = 0
        self.last_status: int | None = None

    def start(self) -> PodReporter:
        self._thread.start()
        return self

    def report(self, final: bool = False) -> ProgressReport | None:
        """The pod's summed rank files as the operator reads them; None while no rank has started."""
        pod = read_pod([self.directory])
        if pod.ranks == 0:
            return None
        return ProgressReport(pod=self.target.pod, index=self.target.index, attempt=self.target.attempt,
                              ranks=pod.ranks, **asdict(pod.counts), last_step_time=moment(pod.last_step_time),
                              last_image_time=moment(pod.last_image_time),
                              sent_at=datetime.datetime.now(datetime.UTC).replace(microsecond=0),
                              final=final, finished=pod.done)

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            host, port = self._url.hostname or "", self._url.port
            if self._url.scheme == "https":
                context = ssl.create_default_context(cafile=self.target.ca_file)
                self._conn = http.client.HTTPSConnection(host, port, timeout=POST_TIMEOUT_SECONDS, context=context)
            else:
                self._conn = http.client.HTTPConnection(host, port, timeout=POST_TIMEOUT_SECONDS)
        return self._conn

    def send(self, final: bool = False) -> None:
        try:
            report = self.report(final)
        except ValueError as e:  # a rank file's time that is not one: progress must never break generation
            log.warning("progress: cannot build the report: %s", e)
            return
        if report is None:
            return  # no rank has started yet: nothing to say
        try:
            token = Path(self.target.token_file).read_text().strip()
        except OSError as e:
            log.warning("progress: cannot read the token %s: %s", self.target.token_file, e)
            return
        data = report.to_wire()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        path = self._url.path + (f"?{self._url.query}" if self._url.query else "")
        try:
            conn = self._connection()
            conn.request("POST", path, body=data, headers=headers)
            resp = conn.getresponse()
            answer = resp.read()
            self.last_status = resp.status
            self.sent += 1
            if resp.status == 200:
                asked = json.loads(answer or b"{}").get("intervalSeconds")
                if isinstance(asked, int | float) and asked > 0:
                    self.interval = float(asked)
            elif resp.status != 204:
                log.warning("progress post refused (%d): %s", resp.status, answer[:200].decode(errors="replace"))
        except (OSError, http.client.HTTPException, ValueError) as e:  # progress must never break generation
            log.warning("progress post to %s failed: %s", self.target.url, e)
            if self._conn is not None:
                self._conn.close()
            self._conn = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.send()
            self._stop.wait(self.interval)

    def close(self) -> None:
        """Stop the thread and send the final counts (synchronously, once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=POST_TIMEOUT_SECONDS + 5)
        self.send(final=True)
        if self._conn is not None:
            self._conn.close()


# -- the per-rank front end ------------------------------------------------------------------


class RankProgress:
    """What main.py talks to: counts, JSON lines and the rank file together."""

    def __init__(self, rank: int, job_total: int, writes: bool, local: bool, rank_file: RankFile | None = None):
        self.rank = rank
        self.writes = writes
        self.state = RankState(Counts(total=job_total if writes else 0), job_total=job_total)
        self.local = local
        self.rank_file = rank_file
        self.steps = 0
        self.slowest_item_seconds = 0.0  # what the merge's wait bound scales with
        self._closed = False
        if rank_file is not None:
            rank_file.update(self.state, force=True)

    @property
    def counts(self) -> Counts:
        return self.state.counts

    def item_done(self, key: str, status: str, seconds: float) -> None:
        if not self.writes:
            return
        counts = self.state.counts
        if status == "completed":
            counts.completed += 1
            self.slowest_item_seconds = max(self.slowest_item_seconds, seconds)
        elif status == "skipped":
            counts.skipped += 1
        else:
            counts.failed += 1
        self.state.last_image_time = now_iso()
        if not self.local:
            line = {"event": status, "key": key, "rank": self.rank, **asdict(counts), "seconds": round(seconds, 4)}
            sys.stdout.write(PROGRESS_LINE_PREFIX + json.dumps(line) + "\n")
            sys.stdout.flush()
        if self.rank_file is not None:
            self.rank_file.update(self.state)

    def step_done(self) -> None:
        """Called by the pipeline's step callback on every rank (writers or not)."""
        self.steps += 1
        self.state.last_step_time = now_iso()
        if self.rank_file is not None:
            self.rank_file.update(self.state)

    def finished(self) -> None:
        """This rank has no more work: its silence from now on is expected."""
        self.state.done = True
        if self.rank_file is not None:
            self.rank_file.update(self.state, force=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.rank_file is not None:
            self.rank_file.update(self.state, force=True)
            self.rank_file.close()
