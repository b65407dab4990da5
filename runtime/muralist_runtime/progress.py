"""Progress: a bar for people, JSON lines for machines, a ConfigMap for the operator, and the
termination message Kubernetes keeps after the container exits.

- Local runs (`muralist run` sets MURALIST_LOCAL=1): a tqdm bar on rank 0, to stderr.
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
- Exit: a summary JSON (under 4 KiB) to /dev/termination-log when it exists, or to the file
  named by MURALIST_TERMINATION_LOG.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import ssl
import sys
import threading
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .spec import PROGRESS_LINE_PREFIX, TERMINATION_LOG, TERMINATION_LOG_ENV

log = logging.getLogger("muralist.progress")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TERMINATION_MESSAGE_MAX = 4096
PATCH_INTERVAL_SECONDS = 5.0


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class Counts:
    completed: int = 0
    skipped: int = 0
    failed: int = 0
    total: int = 0


# -- termination message ---------------------------------------------------------------------


def termination_log_path() -> Path | None:
    override = os.environ.get(TERMINATION_LOG_ENV)
    if override:
        return Path(override)
    path = Path(TERMINATION_LOG)
    return path if path.exists() else None


def summary(counts: Counts, exit_code: int, permanent: bool, reason: str, message: str,
            timings: dict[str, float] | None = None) -> str:
    """The termination message; `timings` adds loadSeconds, generateSeconds... when known."""
    doc: dict[str, Any] = {**asdict(counts), "exitCode": exit_code, "permanent": permanent,
                           "reason": reason, "message": message}
    doc.update({k: round(v, 3) for k, v in (timings or {}).items()})
    text = json.dumps(doc)
    if len(text.encode()) > TERMINATION_MESSAGE_MAX:
        # Only the message can be long (a traceback's last line, a path): cut it to fit.
        over = len(text.encode()) - TERMINATION_MESSAGE_MAX + 16
        doc["message"] = message.encode()[: max(0, len(message.encode()) - over)].decode(
            errors="ignore") + "..."
        text = json.dumps(doc)
    return text


# Every local rank of a container may write its one termination message, each with a reason.
_SEVERITY = {"Completed": 0, "Error": 1, "PermanentFailure": 2}


def _severity(text: str) -> int:
    try:
        return _SEVERITY.get(json.loads(text).get("reason"), 0)
    except (ValueError, AttributeError):
        return -1  # empty (nothing written yet) or unreadable


def write_termination(text: str) -> None:
    """Replace the termination message under an exclusive lock, unless it holds a more severe one.

    Unlocked, two ranks failing together can interleave their writes into invalid JSON, and the
    operator loses the reason. A rank's PermanentFailure also outlives the Error another rank
    then hits in a collective, so the job is not retried in vain.
    """
    path = termination_log_path()
    if path is None:
        return
    try:
        with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            if _severity(f.read()) > _severity(text):
                return
            f.seek(0)
            f.truncate()
            f.write(text)
    except OSError as e:
        log.warning("cannot write the termination message to %s: %s", path, e)


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
    name, namespace = env.get("MURALIST_PROGRESS_CONFIGMAP"), env.get("MURALIST_NAMESPACE")
    if not name or not namespace:
        return None
    base = env.get("MURALIST_KUBE_API")
    token = env.get("MURALIST_KUBE_TOKEN")
    ca = env.get("MURALIST_KUBE_CA")
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
    """What main.py talks to: counts, bar, JSON lines and the reporter together."""

    def __init__(self, rank: int, total: int, writes: bool, local: bool,
                 reporter: ConfigMapReporter | None = None):
        self.rank = rank
        self.writes = writes
        self.counts = Counts(total=total if writes else 0)
        self.local = local
        self.reporter = reporter
        self.bar = None
        self.steps = 0
        if local and rank == 0:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="images (rank 0)", unit="img", file=sys.stderr)
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
        if self.bar is not None:
            self.bar.update(1)
        if not self.local:
            line = {"event": status, "key": key, "rank": self.rank, **asdict(self.counts),
                    "seconds": round(seconds, 4)}
            sys.stdout.write(PROGRESS_LINE_PREFIX + json.dumps(line) + "\n")
            sys.stdout.flush()
        if self.reporter is not None:
            self.reporter.update(self.counts)

    def step_done(self) -> None:
        """Called by the pipeline's step callback on every rank (writers or not)."""
        self.steps += 1
        if self.reporter is not None:
            self.reporter.step()

    def close(self) -> None:
        """Idempotent: main closes on success before the summary, and again in `finally`."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.reporter is not None:
            self.reporter.close()
