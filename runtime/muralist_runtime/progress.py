"""Progress: a bar for people, JSON lines for machines, live counts for the operator.

- Every rank keeps its counts in a small JSON file in its pod's progress directory
  (`RankFile`, MURALIST_PROGRESS_DIR or /tmp/muralist-progress): what one pod's ranks have done,
  readable without a collective. `muralist run` sums those files of all its agents into one
  bar for the whole job (all ranks, all nodes).
- Pods: one line per finished image on stdout, `MURALIST_PROGRESS {json}`.
- Live cluster progress: with MURALIST_PROGRESS_CONFIGMAP and MURALIST_NAMESPACE set and a
  service-account token, each rank merge-patches `data["rank-<rank>"]` of that ConfigMap from
  a daemon thread (at most one patch per interval, plus a last one): generation never waits
  on the API server, and its errors are logged and ignored. Ranks that do not write images
  (the non-first ranks of a CP/TP group) report zero counts and only heartbeat, so the
  operator can sum the counts of all ranks.
- Stall detection: each report carries `lastStepTime` (the last denoising step, from the
  pipeline's step callback, on every rank of a group) and `lastImageTime` (the last image on
  disk); the operator watches those. `heartbeatTime` only proves the process is alive: a rank
  stuck in a collective or a hung kernel keeps heartbeating from this thread.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import ssl
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .spec import contract
from .spec.contract import PROGRESS_LINE_PREFIX, Counts

log = logging.getLogger("muralist.progress")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PATCH_INTERVAL_SECONDS = 5.0
DEFAULT_PROGRESS_DIR = "/tmp/muralist-progress"
RANK_FILE_INTERVAL_SECONDS = 0.5


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- the per-pod progress directory ----------------------------------------------------------


def progress_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    return Path(env.get(contract.MURALIST_PROGRESS_DIR) or DEFAULT_PROGRESS_DIR)


class RankFile:
    """This rank's counts as `rank-<r>.json` in the pod's progress directory (atomic, throttled)."""

    def __init__(self, directory: Path, rank: int, interval: float = RANK_FILE_INTERVAL_SECONDS):
        self.path = directory / f"rank-{rank}.json"
        self.interval = interval
        self._last = 0.0
        directory.mkdir(parents=True, exist_ok=True)

    def update(self, counts: Counts, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps(asdict(counts)))
            os.replace(tmp, self.path)
        except OSError as e:  # progress must never break generation
            log.warning("cannot write %s: %s", self.path, e)


def read_counts(directories: list[Path]) -> Counts:
    """The sum of every rank file in these progress directories (unreadable ones skipped)."""
    total = Counts()
    for directory in directories:
        for path in directory.glob("rank-*.json"):
            try:
                one = Counts(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            total.completed += one.completed
            total.skipped += one.skipped
            total.failed += one.failed
            total.total += one.total
    return total


# -- the ConfigMap reporter ------------------------------------------------------------------


@dataclass(frozen=True)
class KubeTarget:
    base_url: str
    namespace: str
    configmap: str
    token: str
    ca_file: str | None

    @property
    def url(self) -> str:
        return f"{self.base_url.rstrip('/')}/api/v1/namespaces/{self.namespace}/configmaps/{self.configmap}"


def kube_target_from_env(env: dict[str, str] | None = None) -> KubeTarget | None:
    """In-cluster settings, or MURALIST_KUBE_API / _TOKEN / _CA (tests); None when not set."""
    env = dict(os.environ) if env is None else env
    name, namespace = env.get(contract.MURALIST_PROGRESS_CONFIGMAP), env.get(contract.MURALIST_NAMESPACE)
    if not name or not namespace:
        return None
    base = env.get(contract.MURALIST_KUBE_API)
    token = env.get(contract.MURALIST_KUBE_TOKEN)
    ca = env.get(contract.MURALIST_KUBE_CA)
    if base is None:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            return None
        base = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        ca = ca or str(SA_DIR / "ca.crt")
    if token is None:
        token_file = SA_DIR / "token"
        if not token_file.is_file():
            return None
        token = token_file.read_text().strip()
    return KubeTarget(base, namespace, name, token, ca)


class ConfigMapReporter:
    """Sends this rank's counts to the progress ConfigMap from a daemon thread."""

    def __init__(self, target: KubeTarget, rank: int, attempt: int,
                 interval: float = PATCH_INTERVAL_SECONDS):
        self.target = target
        self.rank = rank
        self.attempt = attempt
        self.interval = interval
        self._lock = threading.Lock()
        self._counts = Counts()
        self._last_image: str | None = None
        self._last_step: str | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="muralist-progress", daemon=True)
        self.sent = 0
        ctx = None
        if target.base_url.startswith("https"):
            ctx = ssl.create_default_context(cafile=target.ca_file) if target.ca_file else None
        self._ssl = ctx

    def start(self) -> ConfigMapReporter:
        self._thread.start()
        return self

    def update(self, counts: Counts, image_finished: bool = True) -> None:
        with self._lock:
            self._counts = Counts(**asdict(counts))
            if image_finished:
                self._last_image = now_iso()

    def step(self) -> None:
        """A denoising step finished (called from the generating thread, once per step)."""
        stamp = now_iso()
        with self._lock:
            self._last_step = stamp

    def payload(self) -> dict[str, Any]:
        with self._lock:
            value = {"attempt": self.attempt, **asdict(self._counts),
                     "lastStepTime": self._last_step, "lastImageTime": self._last_image,
                     "heartbeatTime": now_iso()}
        return {"data": {f"rank-{self.rank}": json.dumps(value)}}

    def _send(self) -> None:
        body = json.dumps(self.payload()).encode()
        req = urllib.request.Request(
            self.target.url, data=body, method="PATCH",
            headers={"Content-Type": "application/merge-patch+json",
                     "Authorization": f"Bearer {self.target.token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10, context=self._ssl) as resp:
                resp.read()
            self.sent += 1
        except Exception as e:  # progress must never break generation
            log.warning("progress patch to %s failed: %s", self.target.url, e)

    def _run(self) -> None:
        # Heartbeat every interval even without new images: the operator's stall detection
        # tells a slow image from a dead rank by the heartbeat.
        while not self._stop.is_set():
            self._send()
            self._stop.wait(self.interval)

    def close(self) -> None:
        """Stop the thread and send the final counts (synchronously, once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        self._send()


# -- the per-rank progress front end ---------------------------------------------------------


class Progress:
    """What main.py talks to: counts, JSON lines, the rank file and the reporter together."""

    def __init__(self, rank: int, total: int, writes: bool, local: bool,
                 reporter: ConfigMapReporter | None = None, rank_file: RankFile | None = None):
        self.rank = rank
        self.writes = writes
        self.counts = Counts(total=total if writes else 0)
        self.local = local
        self.reporter = reporter
        self.rank_file = rank_file
        self.steps = 0
        self._closed = False
        if rank_file is not None:
            rank_file.update(self.counts, force=True)
        if reporter is not None:
            reporter.update(self.counts, image_finished=False)

    def image_done(self, key: str, status: str, seconds: float) -> None:
        if not self.writes:
            return
        if status == "completed":
            self.counts.completed += 1
        elif status == "skipped":
            self.counts.skipped += 1
        else:
            self.counts.failed += 1
        if not self.local:
            line = {"event": status, "key": key, "rank": self.rank, **asdict(self.counts),
                    "seconds": round(seconds, 4)}
            sys.stdout.write(PROGRESS_LINE_PREFIX + json.dumps(line) + "\n")
            sys.stdout.flush()
        if self.rank_file is not None:
            self.rank_file.update(self.counts)
        if self.reporter is not None:
            self.reporter.update(self.counts)

    def step_done(self) -> None:
        """Called by the pipeline's step callback on every rank (writers or not)."""
        self.steps += 1
        if self.reporter is not None:
            self.reporter.step()

    def close(self) -> None:
        """The final counts reach the rank file and the ConfigMap, once."""
        if self._closed:
            return
        self._closed = True
        if self.rank_file is not None:
            self.rank_file.update(self.counts, force=True)
        if self.reporter is not None:
            self.reporter.close()
