"""The chart's monitoring: the Grafana dashboard's ConfigMap and the PrometheusRule render only
when enabled; the dashboard passes the Grafana dashboard schema (hack/dashboard-check); every
query of both reads only metrics the operator exports; promtool accepts the rules and the
dashboard's queries, and its rule test proves the stalled-job alert."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from muralist_api.contract.progress import ProgressReport
from muralist_operator import metrics
from muralist_operator.progress.aggregate import Aggregator
from prometheus_client import REGISTRY

from tests.chart.conftest import CHART, kinds, one, render, require_tool, run
from tests.promql import metric_names, with_grafana_variables

DASHBOARD = CHART / "dashboards" / "muralist.json"
RULE_TESTS = Path(__file__).parent / "monitoring"
ENABLED = {"metrics": {"enabled": True, "dashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}
# Series Prometheus itself makes for every scrape target.
PROMETHEUS_SERIES = {"up"}


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="session")
def dashboard_check() -> str:
    return require_tool("dashboard-check")


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def rules(helm: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rule = one(render(helm, values or ENABLED), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def exported_metric_names() -> set[str]:
    """The sample names the operator exposes: its registered metrics and the scrape-time
    collector (fed one job so that every family is built), as Prometheus will see them."""
    aggregator = Aggregator()
    aggregator.record(("ns", "cats"), ProgressReport(
        pod="cats-0-0", index=0, attempt=0, ranks=1, completed=1, skipped=0, failed=0, total=2,
        last_step_time=datetime.now(UTC), last_image_time=None, sent_at=datetime.now(UTC), final=False,
        finished=False))
    families = [*REGISTRY.collect(), *metrics.JobCollector(aggregator, responses=lambda: {204: 1}).collect()]
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {f.name + suffix for f in families if f.name.startswith("muralist_") for suffix in suffixes[f.type]}


# -- rendering


@pytest.mark.parametrize("enabled", [False, True], ids=["off", "on"])
def test_dashboard_and_rule_render_only_when_enabled(helm: str, enabled: bool) -> None:
    values = {"metrics": {"enabled": True, "dashboard": {"enabled": enabled},
                          "prometheusRule": {"enabled": enabled}}}
    rendered = kinds(render(helm, values))
    assert ("PrometheusRule" in rendered) is enabled
    assert ("ConfigMap" in rendered) is enabled
    assert "ConfigMap" not in kinds(render(helm)) and "PrometheusRule" not in kinds(render(helm))


def test_nothing_to_show_without_metrics(helm: str) -> None:
    values = {"metrics": {"enabled": False, "dashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}
    assert not {"ConfigMap", "PrometheusRule"} & set(kinds(render(helm, values)))


def test_dashboard_configmap_carries_the_charts_file_for_the_sidecar(helm: str) -> None:
    values = {"metrics": {"enabled": True, "dashboard": {
        "enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "Muralist"}}}}
    configmap = one(render(helm, values), "ConfigMap")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Muralist"}
    assert json.loads(configmap["data"]["muralist.json"]) == dashboard()
    # The release namespace unless told otherwise.
    default = one(render(helm, {"metrics": {"enabled": True, "dashboard": {"enabled": True}}}), "ConfigMap")
    assert default["metadata"]["namespace"] == "muralist-system"


def test_rule_thresholds_and_labels_come_from_values(helm: str) -> None:
    values = {"metrics": {"enabled": True, "prometheusRule": {
        "enabled": True, "labels": {"release": "prom"}, "alertLabels": {"severity": "page", "team": "ml"},
        "stalledJob": {"minutes": 20}, "itemFailures": {"window": "2h", "ratio": 0.25, "minItems": 50},
        "restarts": {"window": "30m", "count": 2}, "progressRefusals": {"window": "15m", "ratio": 0.5},
        "operatorDown": {"for": "10m", "upSelector": 'job="muralist"'}}}}
    rule = one(render(helm, values), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    by_name = {r["alert"]: r for r in rules(helm, values)}
    assert "> 1200" in by_name["MuralistJobStalled"]["expr"]
    failing = by_name["MuralistJobItemsFailing"]["expr"]
    assert "[2h]" in failing and "> 0.25" in failing and ">= 50" in failing
    assert "[30m]" in by_name["MuralistPodGroupsRestarting"]["expr"]
    assert "> 0.5" in by_name["MuralistProgressPostsRefused"]["expr"]
    down = by_name["MuralistOperatorDown"]
    assert down["expr"] == 'absent(up{job="muralist"} == 1)' and down["for"] == "10m"
    assert all(r["labels"] == {"severity": "page", "team": "ml"} for r in by_name.values())


def test_operator_down_watches_the_service_monitors_target_by_default(helm: str) -> None:
    down = {r["alert"]: r for r in rules(helm)}["MuralistOperatorDown"]
    assert down["expr"] == 'absent(up{job="muralist-metrics", namespace="muralist-system"} == 1)'


def test_the_service_monitor_keeps_the_jobs_namespace_label(helm: str) -> None:
    values = {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True}}}
    monitor = one(render(helm, values, extra=["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"]),
                  "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


# -- the queries read what the operator exports


def test_metric_names_are_read_from_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (le) (rate(a_bucket{job=~"$job", code!~"5.."}[$__rate_interval]))) '
            '/ on (namespace) group_left (phase) b offset 1h > 1e3 and absent(up == 1) unless c @ 1700000000')
    assert metric_names(with_grafana_variables(expr)) == {"a_bucket", "b", "up", "c"}


def test_every_dashboard_query_reads_exported_metrics() -> None:
    exported = exported_metric_names() | PROMETHEUS_SERIES
    queries = dashboard_queries()
    assert queries
    for title, expr in queries:
        names = metric_names(with_grafana_variables(expr))
        assert names and names <= exported, f"panel {title!r} reads {sorted(names - exported)}: not exported"
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            names = metric_names(variable["query"].removeprefix("label_values(").rsplit(",", 1)[0])
            assert names <= exported, f"variable {variable['name']!r} reads {sorted(names - exported)}"


def test_every_alert_reads_exported_metrics(helm: str) -> None:
    exported = exported_metric_names() | PROMETHEUS_SERIES
    for rule in rules(helm):
        names = metric_names(rule["expr"])
        assert names and names <= exported, f"{rule['alert']} reads {sorted(names - exported)}: not exported"


def test_the_dashboard_shows_every_exported_metric() -> None:
    read = set().union(*(metric_names(with_grafana_variables(expr)) for _, expr in dashboard_queries()))
    families = {name.removesuffix("_bucket") for name in exported_metric_names()
                if not name.endswith(("_sum", "_count"))}
    assert families <= {name.removesuffix("_bucket") for name in read}, sorted(families - read)


# -- the real checkers


def test_dashboard_passes_the_grafana_schema(dashboard_check: str) -> None:
    run(dashboard_check, str(DASHBOARD))


def test_dashboard_check_refuses_what_the_schema_does_not_know(dashboard_check: str, tmp_path: Path) -> None:
    board = dashboard()
    board["panels"][1]["options"]["colour"] = "red"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(board))
    proc = subprocess.run([dashboard_check, str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1 and "unexpected field 'colour'" in proc.stderr, proc.stderr


def test_promtool_accepts_the_rules_and_the_dashboards_queries(helm: str, promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "muralist", "rules": rules(helm)}]}))
    # The dashboard's queries as recording rules: promtool parses each as Prometheus would.
    recorded = [{"record": f"dashboard:panel{n}", "expr": with_grafana_variables(expr)}
                for n, (_, expr) in enumerate(dashboard_queries())]
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    out = run(promtool, "check", "rules", str(tmp_path / "rules.yaml"), str(tmp_path / "dashboard.yaml"))
    assert "SUCCESS: 5 rules found" in out and f"SUCCESS: {len(recorded)} rules found" in out, out


def test_promtool_proves_the_stalled_job_alert(helm: str, promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "muralist", "rules": rules(helm)}]}))
    shutil.copy(RULE_TESTS / "stalled_job_test.yaml", tmp_path)
    out = run(promtool, "test", "rules", str(tmp_path / "stalled_job_test.yaml"))
    assert "SUCCESS" in out, out
