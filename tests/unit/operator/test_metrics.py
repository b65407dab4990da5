"""The operator's metrics: the per-job progress and endpoint series read at scrape time."""

from __future__ import annotations

import urllib.request
from datetime import timedelta

from muralist_api.contract.progress import ProgressReport
from muralist_operator import metrics
from muralist_operator.metrics import JobCollector
from muralist_operator.progress.aggregate import Aggregator
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.operator.clock import T0, Clock


def report(index: int, completed: int, failed: int = 0, step: int | None = None, final: bool = False) -> ProgressReport:
    return ProgressReport(
        pod=f"cats-0-{index}", index=index, attempt=0, ranks=1, completed=completed, skipped=0, failed=failed,
        total=100, last_step_time=None if step is None else T0 + timedelta(seconds=step), last_image_time=None,
        sent_at=T0, final=final, finished=False,
    )


def scrape(collector: JobCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What Prometheus would read: {(sample name, sorted labels): value}."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


CATS = (("diffusionjob", "cats"), ("namespace", "ns"))


def test_a_jobs_progress_is_exported_as_its_pods_report_it() -> None:
    clock = Clock()
    aggregator = Aggregator(clock=clock)
    aggregator.record(("ns", "cats"), report(0, completed=10, failed=1, step=30))
    aggregator.record(("ns", "cats"), report(1, completed=5, step=50))
    clock.now += 10
    aggregator.record(("ns", "cats"), report(1, completed=25, step=70))
    samples = scrape(JobCollector(aggregator, phases=lambda: {("ns", "cats"): "Running"}))

    assert samples[("muralist_job_items_completed_total", CATS)] == 35
    assert samples[("muralist_job_items_failed_total", CATS)] == 1
    assert samples[("muralist_job_items", CATS)] == 100
    # 20 images over the 10 s since the job was first seen; 64 left at 2 per second.
    assert samples[("muralist_job_images_per_second", CATS)] == 2.0
    assert samples[("muralist_job_estimated_seconds_remaining", CATS)] == 32
    # Index 0 has been quiet since its step at 30 s: the job's oldest sign of progress.
    assert samples[("muralist_job_last_progress_timestamp_seconds", CATS)] == (T0 + timedelta(seconds=30)).timestamp()
    assert samples[("muralist_diffusionjob_phase", (*CATS, ("phase", "Running")))] == 1


def test_no_last_progress_once_every_pod_has_finished() -> None:
    aggregator = Aggregator(clock=Clock())
    aggregator.record(("ns", "cats"), report(0, completed=100, step=30, final=True))
    samples = scrape(JobCollector(aggregator, phases=dict))
    assert samples[("muralist_job_items_completed_total", CATS)] == 100
    assert not [key for key in samples if key[0] == "muralist_job_last_progress_timestamp_seconds"]


def test_a_forgotten_job_leaves_no_series() -> None:
    aggregator = Aggregator(clock=Clock())
    aggregator.record(("ns", "cats"), report(0, completed=1))
    aggregator.forget(("ns", "cats"))
    samples = scrape(JobCollector(aggregator, phases=dict))
    assert not [key for key in samples if ("namespace", "ns") in key[1]]


def test_the_endpoints_answers_by_status_code() -> None:
    answers = {204: 40, 200: 2, 401: 3}
    samples = scrape(JobCollector(Aggregator(clock=Clock()), responses=lambda: answers, phases=dict))
    assert {labels: value for (name, labels), value in samples.items() if name == "muralist_progress_responses_total"} \
        == {(("code", "200"),): 2, (("code", "204"),): 40, (("code", "401"),): 3}


def test_a_standby_replica_exports_no_job_series() -> None:
    aggregator = Aggregator(clock=Clock())
    aggregator.record(("ns", "cats"), report(0, completed=1, step=30))
    samples = scrape(JobCollector(aggregator, responses=lambda: {503: 2}, phases=lambda: {("ns", "cats"): "Running"},
                                  is_active=lambda: False))
    assert not [key for key in samples if ("namespace", "ns") in key[1]]
    assert samples[("muralist_progress_responses_total", (("code", "503"),))] == 2


def test_without_the_endpoint_no_response_series() -> None:
    samples = scrape(JobCollector(Aggregator(clock=Clock()), responses=None, phases=dict))
    assert not [key for key in samples if key[0].startswith("muralist_progress_responses")]


def test_the_metrics_port_serves_the_jobs_progress() -> None:
    """What main wires up: the scrape-time series served over HTTP beside the registered ones."""
    aggregator = Aggregator(clock=Clock())
    aggregator.record(("ns", "cats"), report(0, completed=3, step=30))
    server = metrics.serve(0, aggregator, lambda: {204: 7}, registry=CollectorRegistry(), host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("muralist_job_items_completed_total", CATS)] == 3
    assert samples[("muralist_progress_responses_total", (("code", "204"),))] == 7


def test_a_jobs_cost_is_exported_while_its_phase_is_known() -> None:
    from muralist_api.status import Cost

    key = ("ns", "cost-job")
    labels = (("diffusionjob", "cost-job"), ("namespace", "ns"))
    metrics.observe_cost(key, Cost(gpu_seconds=1800, gpu_seconds_per_item=180, cost_so_far=1.8,
                                   estimated_cost_to_finish=5.04))
    try:
        samples = scrape(JobCollector(Aggregator(clock=Clock()), phases=lambda: {key: "Running"}))
        expected = {"muralist_job_gpu_seconds": 1800, "muralist_job_gpu_seconds_per_item": 180,
                    "muralist_job_cost": 1.8, "muralist_job_estimated_cost_to_finish": 5.04}
        assert {name: samples[name, labels] for name in expected} == expected
        # A job this replica does not track (another's, or one it forgot) exports no cost.
        assert not [k for k in scrape(JobCollector(Aggregator(clock=Clock()), phases=dict)) if k[1] == labels]
    finally:
        metrics.forget(key)
    assert key not in metrics.job_costs()
