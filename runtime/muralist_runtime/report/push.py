"""The pod's pushed reports: its ranks' files, summed, posted to the operator.

The pod's first local rank posts (`PodReporter`, MURALIST_PROGRESS_URL) every few seconds and
once at the end, over HTTPS with the pod's projected service-account token (re-read from its
file on each post: the kubelet rotates it). The body, its path, the token's audience and the
interval are the API's progress wire (muralist_api.contract.progress: `ProgressReport`).
Generation never waits on it; errors are logged and ignored. Counts are cumulative for the pod,
so a lost post loses nothing.
"""

from __future__ import annotations

import datetime
import http.client
import json
import logging
import os
import ssl
import threading
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path

from muralist_api import contract
from muralist_api.contract.env import PodEnv
from muralist_api.contract.progress import DEFAULT_POST_INTERVAL_SECONDS, ProgressReport

from .rank_files import read_pod

log = logging.getLogger("muralist.progress")

POST_TIMEOUT_SECONDS = 10.0


def moment(text: str | None) -> datetime.datetime | None:
    """A time now_iso wrote (rank files keep them as text), for the report."""
    return None if text is None else datetime.datetime.fromisoformat(text)



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
                              final=final, finished=pod.quiet)

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
