"""Prometheus metrics: jobs by phase, reconcile duration, restarts; and, read from memory when
Prometheus scrapes, each job's progress and cost (status.cost) and the progress endpoint's answers."""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from wsgiref.simple_server import WSGIServer

from muralist_api.status import Cost
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from muralist_operator.progress.aggregate import Aggregator

RECONCILE_SECONDS = Histogram(
    "muralist_reconcile_duration_seconds",
    "Time to reconcile one DiffusionJob (observe, decide, write status, act).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RESTARTS = Counter("muralist_restarts_total", "Pod groups recreated after a failure.", ["reason"])
JOBS = Gauge("muralist_diffusionjobs", "DiffusionJobs known to this operator, by phase.", ["phase"])

PHASES = ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
JOB_LABELS = ["namespace", "diffusionjob"]

_phases: dict[tuple[str, str], str] = {}
# status.cost as each job's last reconcile left it: (GPU-seconds, per item, cost so far, cost to finish).
_costs: dict[tuple[str, str], tuple[float, float | None, float | None, float | None]] = {}
_guard = threading.Lock()


def _publish() -> None:
    tally = Tally(_phases.values())
    for phase in PHASES:
        JOBS.labels(phase=phase).set(tally.get(phase, 0))


def observe_phase(key: tuple[str, str], phase: str) -> None:
    with _guard:
        _phases[key] = phase
        _publish()


def observe_cost(key: tuple[str, str], cost: Cost | None) -> None:
    with _guard:
        if cost is None:
            _costs.pop(key, None)
        else:
            _costs[key] = (cost.gpu_seconds, cost.gpu_seconds_per_item, cost.cost_so_far,
                           cost.estimated_cost_to_finish)


def forget(key: tuple[str, str]) -> None:
    with _guard:
        _phases.pop(key, None)
        _costs.pop(key, None)
        _publish()


def job_costs() -> dict[tuple[str, str], tuple[float, float | None, float | None, float | None]]:
    with _guard:
        return dict(_costs)


def job_phases() -> dict[tuple[str, str], str]:
    with _guard:
        return dict(_phases)


class JobCollector(Collector):
    """Per-job series and the endpoint's counts, built when Prometheus scrapes (every 30 s or so),
    never per post: the endpoint takes hundreds of posts a second, a scrape costs one snapshot
    per job.

    The item counts are counters: a job's pods report cumulative counts, so after an operator
    restart they come back at their level with the pods' next posts (within seconds), not from 0."""

    def __init__(self, aggregator: Aggregator, responses: Callable[[], Mapping[int, int]] | None = None,
                 phases: Callable[[], Mapping[tuple[str, str], str]] = job_phases,
                 is_active: Callable[[], bool] = lambda: True) -> None:
        """`responses`: the progress endpoint's answers so far by HTTP status (None: no endpoint).
        `is_active`: whether this replica reconciles. A standby exports no per-job series: what it
        remembers from before it stood down is stale, and the active replica exports the truth."""
        self._aggregator = aggregator
        self._responses = responses
        self._phases = phases
        self._is_active = is_active

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked: the series come and go with the jobs

    def collect(self) -> Iterator[Metric]:
        active = self._is_active()
        phase = GaugeMetricFamily("muralist_diffusionjob_phase",
                                  "1 for each DiffusionJob in its current phase (one series per job).",
                                  labels=[*JOB_LABELS, "phase"])
        for (namespace, name), current in sorted(self._phases().items() if active else ()):
            phase.add_metric([namespace, name, current], 1)
        yield phase
        yield from self._progress(active)
        yield from self._costs(active, set(self._phases()))
        if self._responses is not None:
            answers = CounterMetricFamily("muralist_progress_responses",
                                          "Progress posts answered by the endpoint, by HTTP status code.",
                                          labels=["code"])
            for code, count in sorted(dict(self._responses()).items()):
                answers.add_metric([str(code)], count)
            yield answers

    def _progress(self, active: bool) -> Iterator[Metric]:
        completed = CounterMetricFamily("muralist_job_items_completed",
                                        "Items done (rendered, or found done from an earlier attempt), as the "
                                        "job's pods report them.", labels=JOB_LABELS)
        failed = CounterMetricFamily("muralist_job_items_failed", "Items that failed, as the job's pods report them.",
                                     labels=JOB_LABELS)
        total = GaugeMetricFamily("muralist_job_items", "The job's item count (status.progress.total).",
                                  labels=JOB_LABELS)
        rate = GaugeMetricFamily("muralist_job_images_per_second",
                                 "Images rendered per second over the last minute (status.progress.imagesPerSecond).",
                                 labels=JOB_LABELS)
        eta = GaugeMetricFamily("muralist_job_estimated_seconds_remaining",
                                "Time to finish at the current rate (status.progress.estimatedSecondsRemaining).",
                                labels=JOB_LABELS)
        quiet = GaugeMetricFamily("muralist_job_last_progress_timestamp_seconds",
                                  "The last sign of progress (a denoising step, an image) of the job's longest-quiet "
                                  "unfinished pod: what stall detection measures from. Absent when no pod is working.",
                                  labels=JOB_LABELS)
        for key in sorted(self._aggregator.jobs() if active else ()):
            snapshot = self._aggregator.snapshot(key)
            if snapshot is None:
                continue  # forgotten since listed
            labels = list(key)
            completed.add_metric(labels, snapshot.completed)
            failed.add_metric(labels, snapshot.failed)
            total.add_metric(labels, snapshot.total)
            if snapshot.images_per_second is not None:
                rate.add_metric(labels, snapshot.images_per_second)
            if snapshot.estimated_seconds_remaining is not None:
                eta.add_metric(labels, snapshot.estimated_seconds_remaining)
            if snapshot.oldest_progress_time is not None:
                quiet.add_metric(labels, snapshot.oldest_progress_time.timestamp())
        yield from (completed, failed, total, rate, eta, quiet)


    def _costs(self, active: bool, known: set[tuple[str, str]]) -> Iterator[Metric]:
        """status.cost of the jobs whose phase this replica tracks."""
        families = [GaugeMetricFamily(name, text, labels=JOB_LABELS) for name, text in (
            ("muralist_job_gpu_seconds", "GPU-seconds the job's pods have held so far (status.cost.gpuSeconds)."),
            ("muralist_job_gpu_seconds_per_item", "GPU-seconds per item rendered (status.cost.gpuSecondsPerItem)."),
            ("muralist_job_cost", "Cost so far at the price per GPU-hour (status.cost.costSoFar)."),
            ("muralist_job_estimated_cost_to_finish", "What the rest of the job should cost "
             "(status.cost.estimatedCostToFinish)."))]
        for key, values in sorted(job_costs().items() if active else ()):
            if key not in known:
                continue
            for family, value in zip(families, values, strict=True):
                if value is not None:
                    family.add_metric(list(key), value)
        yield from families


def serve(port: int, aggregator: Aggregator, responses: Callable[[], Mapping[int, int]] | None,
          is_active: Callable[[], bool] = lambda: True, registry: CollectorRegistry = REGISTRY,
          host: str = "0.0.0.0") -> WSGIServer:
    """Serve /metrics on `port` (0: any free one) from a thread: the registered metrics and the
    jobs' progress. The server is returned for its port and to be shut down (tests)."""
    registry.register(JobCollector(aggregator, responses, is_active=is_active))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
