"""`muralist operator`: wire settings, the reconciler, the progress endpoint, metrics and the
clock, then run kopf.

What the operator keeps goes to kopf in its `memo`: the Reconciler (which the handlers of
handlers.py read it from) and the `OperatorThreads` beside kopf's watches (the clock, the progress
endpoint, metrics), which kopf's startup handlers start once the operator runs and its cleanup
handler stops. kopf's own settings are set by a startup handler too (`configure`)."""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf
from muralist_api.contract import MURALIST_RUNTIME_IMAGE

from muralist_operator import metrics
from muralist_operator.clock import Clock
from muralist_operator.handlers import MEMO_RECONCILER, reconciler_of
from muralist_operator.kube import Kube, load_config
from muralist_operator.naming import LABEL_JOB
from muralist_operator.peering import Peering
from muralist_operator.progress.aggregate import Aggregator
from muralist_operator.progress.auth import TokenVerifier
from muralist_operator.progress.connections import Limits
from muralist_operator.progress.server import ProgressServer
from muralist_operator.progress.tls import TlsMaterial, ensure_certificate, read_mounted
from muralist_operator.reconciler import Reconciler
from muralist_operator.settings import OperatorSettings

log = logging.getLogger("muralist.operator")

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# The label the active replica puts on its own pod; with several replicas the chart's progress
# Service selects it, so posts reach the replica that reconciles.
ACTIVE_LABEL = "muralist.dev/progress-active"
TLS_CHECK_SECONDS = {"secret": 3600.0, "mounted": 60.0}
MEMO_THREADS = "threads"


def settings_from(args: argparse.Namespace) -> OperatorSettings:
    image = args.runtime_image or os.environ.get(MURALIST_RUNTIME_IMAGE)
    settings = OperatorSettings(runtime_image=image) if image else OperatorSettings()
    return dataclasses.replace(settings, network_policies=args.network_policies,
                               price_per_gpu_hour=getattr(args, "price_per_gpu_hour", None))


def progress_limits(args: argparse.Namespace) -> Limits:
    """The endpoint's limits: its defaults, and whatever flags were given."""
    given = {"max_connections": args.progress_max_connections, "handshake_timeout": args.progress_handshake_timeout,
             "request_timeout": args.progress_request_timeout, "idle_timeout": args.progress_idle_timeout}
    return Limits(**{k: v for k, v in given.items() if v is not None})


def operator_namespace(args: argparse.Namespace) -> str:
    if getattr(args, "operator_namespace", None):
        return str(args.operator_namespace)
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SA_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def own_identity() -> str:
    """kopf's peering identity (kopf/_core/engines/peering.py detect_own_id), made here so that
    our peering check knows which entry is ours."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    return f"{getpass.getuser()}@{socket.gethostname()}/{stamp}/{random.randbytes(3).hex()}"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    # We post our own Events (one per transition); kopf's would repeat handler log lines.
    settings.posting.enabled = False
    # Sync handlers wait on the API server most of the time: with hundreds of jobs created at
    # once, more of them in flight keeps each job's path to its Job short (the GIL is not the
    # limit: a reconcile costs well under a millisecond of Python).
    settings.execution.max_workers = 48
    # Reconnect watches promptly: a stale stream would delay every reaction. Each stream ends
    # within client_timeout; recent kopf also drops one that carries nothing, not even the API
    # server's bookmarks, for watching.inactivity_timeout (70 s). A stream is resumed from its last
    # resourceVersion, and listed again when the API server no longer has that (410 Gone).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    # kopf's own calls (its listings, peering): each within a bound, retried on kopf's backoffs.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    # Only our Jobs and pods, filtered by the API server: a cluster's other workloads never
    # reach this process (the handlers' own label filters stay, as a second line).
    settings.watching.label_selectors["batch", "v1", "jobs"] = LABEL_JOB
    settings.watching.label_selectors["", "v1", "pods"] = LABEL_JOB
    reconciler_of(memo).indexes.remember(kwargs, listed=False)


# A thread that cannot start (the progress port taken) stops the operator, as any failed start does.
@kopf.on.startup(errors=kopf.ErrorsMode.PERMANENT)
def start_threads(memo: kopf.Memo, **_: Any) -> None:
    threads_of(memo).start()


@kopf.on.cleanup()
def stop_threads(memo: kopf.Memo, **_: Any) -> None:
    threads_of(memo).stop()


class ProgressEndpoint:
    """The progress endpoint and its certificate, kept fresh from the clock thread."""

    def __init__(self, args: argparse.Namespace, kube: Kube, namespace: str) -> None:
        self.args, self.kube, self.namespace = args, kube, namespace
        self.mode = "mounted" if args.progress_tls_dir else "secret"
        self.tls = self._material()
        self.server: ProgressServer | None = None
        self._checked = time.monotonic()

    def _material(self) -> TlsMaterial:
        if self.args.progress_tls_dir:
            return read_mounted(self.args.progress_tls_dir)
        return ensure_certificate(self.kube.core, self.namespace, self.args.progress_tls_secret,
                                  self.args.progress_service, extra_names=self.args.progress_tls_name)

    @property
    def url(self) -> str:
        return self.args.progress_url or (
            f"https://{self.args.progress_service}.{self.namespace}.svc:{self.args.progress_port}")

    def settings(self, base: OperatorSettings) -> OperatorSettings:
        ca = self.tls.ca_pem.decode() if self.tls.ca_pem else None
        return dataclasses.replace(base, progress_url=self.url, progress_ca=ca)

    def start(self, reconciler: Reconciler, is_active: Callable[[], bool]) -> None:
        verifier = TokenVerifier(self.kube.authentication, reconciler.pod_lookup, reconciler.workers_uid)
        self.server = ProgressServer(
            verifier, reconciler.on_report, self.tls, host="0.0.0.0", port=self.args.progress_port,
            limits=progress_limits(self.args), is_active=is_active, job_exists=reconciler.job_exists,
            interval=lambda _ns, _job: reconciler.aggregator.suggested_interval(),
            lookups_block=False,  # the pod lookup and job_exists read kopf's indexes: memory only
            on_refusal=reconciler.on_refusal,
        ).start()
        log.info("progress endpoint on port %d; pods post to %s", self.server.port, self.url)

    def renew(self, reconciler: Reconciler) -> None:
        """A chore of the clock thread: pick up a renewed certificate (and CA, for new jobs)."""
        if time.monotonic() - self._checked < TLS_CHECK_SECONDS[self.mode]:
            return
        self._checked = time.monotonic()
        material = self._material()
        if material.fingerprint == self.tls.fingerprint:
            return
        log.info("serving a renewed progress certificate (valid until %s)", material.not_after.isoformat())
        self.tls = material
        if self.server is not None:
            self.server.update_tls(material)
        reconciler.settings = self.settings(reconciler.settings)


class OperatorThreads:
    """What runs beside kopf's watches: the progress endpoint, the metrics endpoint and the clock
    thread, whose chores keep the peering verdict and the progress certificate fresh."""

    def __init__(self, reconciler: Reconciler, clock: Clock, progress: ProgressEndpoint | None,
                 peering: Peering, metrics_port: int = 0) -> None:
        self.reconciler, self.clock, self.progress, self.peering = reconciler, clock, progress, peering
        self.metrics_port = metrics_port
        self._stop = threading.Event()
        self._clock_thread: threading.Thread | None = None

    def start(self) -> None:
        reconciler, progress, peering = self.reconciler, self.progress, self.peering
        if progress is not None and progress.server is None:
            progress.start(reconciler, is_active=lambda: peering.active() and reconciler.listed)
        if self.metrics_port:
            server = progress.server if progress is not None else None
            metrics.serve(self.metrics_port, reconciler.aggregator, (lambda: server.responses) if server else None,
                          is_active=peering.active)
            self.metrics_port = 0  # served from here on (the server lives as long as the process)
        if self._clock_thread is None:
            self._clock_thread = threading.Thread(target=self.clock.run, args=(self._stop,), name="muralist-clock",
                                                  daemon=True)
            self._clock_thread.start()

    def stop(self) -> None:
        """Idempotent: kopf's cleanup calls it, and run_operator once kopf has returned."""
        self._stop.set()
        self.reconciler.wake.set()
        if self.progress is not None and self.progress.server is not None:
            self.progress.server.stop()
            self.progress.server = None


def threads_of(memo: kopf.Memo) -> OperatorThreads:
    threads = memo.get(MEMO_THREADS)
    if not isinstance(threads, OperatorThreads):
        raise RuntimeError("kopf's memo holds no OperatorThreads: start the operator with run_operator")
    return threads


def run_operator(args: argparse.Namespace) -> int:
    namespaces: list[str] = args.namespace
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger("muralist").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if not args.verbose:
        # kopf logs "Handler ... succeeded" for every event of every child: thousands of lines a
        # minute with hundreds of jobs, and their formatting costs CPU. Failures still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    load_config()
    kube = Kube.connect()
    namespace = operator_namespace(args)
    identity = own_identity()
    # kopf pauses every replica when two share a priority: make them differ.
    priority = args.priority if args.priority is not None else random.randint(1, 1_000_000)
    peering = Peering(kube.custom, args.peering, identity, priority, namespaces=namespaces)
    settings = settings_from(args)
    progress = ProgressEndpoint(args, kube, namespace) if args.progress_port else None
    settings = progress.settings(settings) if progress else dataclasses.replace(settings, progress_url=None)
    reconciler = Reconciler(kube, settings, Aggregator(), is_active=peering.active)
    clock = Clock(reconciler)

    def peering_chore() -> None:
        if peering.due():
            peering.check()

    clock.chores.append(peering_chore)
    if progress is not None:
        clock.chores.append(lambda: progress.renew(reconciler))
    if args.progress_active_label:
        pod = os.environ.get("POD_ID")
        if not pod:
            raise SystemExit("--progress-active-label needs POD_ID (the operator's pod name, from the downward API)")

        def mark(active: bool) -> None:
            kube.label_pod(namespace, pod, {ACTIVE_LABEL: "true" if active else None})

        peering.listeners.append(mark)
        if peering.standalone:
            mark(True)
    threads = OperatorThreads(reconciler, clock, progress, peering, metrics_port=args.metrics_port)
    try:
        kopf.run(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=args.peering is None,
            peering_name=args.peering,
            identity=identity,  # type: ignore[arg-type]
            priority=priority,
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
            memo=kopf.Memo({MEMO_RECONCILER: reconciler, MEMO_THREADS: threads}),
        )
    finally:
        threads.stop()
    return 0
