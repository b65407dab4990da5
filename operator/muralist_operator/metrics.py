"""Prometheus metrics: jobs by phase, reconcile duration, restarts."""

from __future__ import annotations

import threading
from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILE_SECONDS = Histogram(
    "muralist_reconcile_duration_seconds",
    "Time to reconcile one DiffusionJob (observe, decide, write status, act).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RESTARTS = Counter("muralist_restarts_total", "Pod groups recreated after a failure.", ["reason"])
JOBS = Gauge("muralist_diffusionjobs", "DiffusionJobs known to this operator, by phase.", ["phase"])

_phases: dict[tuple[str, str], str] = {}
_guard = threading.Lock()


def _publish() -> None:
    tally = Tally(_phases.values())
    for phase in ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"):
        JOBS.labels(phase=phase).set(tally.get(phase, 0))


def observe_phase(key: tuple[str, str], phase: str) -> None:
    with _guard:
        _phases[key] = phase
        _publish()


def forget(key: tuple[str, str]) -> None:
    with _guard:
        _phases.pop(key, None)
        _publish()


def serve(port: int) -> None:
    start_http_server(port)
