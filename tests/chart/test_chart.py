"""The Helm chart: lint, rendering per values set, acceptance by a real API server, and the
operator running with exactly the chart's RBAC (a token of the chart's ServiceAccount)."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from muralist_api.job import GROUP, PLURAL, VERSION

from tests.builders import make_job
from tests.chart.conftest import CHART, REPO, dump, kinds, one, render, run
from tests.kube_helpers import fate_annotations, wait_for
from tests.network_policies import admitted, selected
from tests.operator_helpers import OperatorProcess

SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
# The Prometheus Operator's kinds: no CRD for them in the test cluster, so rendered and linted, not dry-run.
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
# Not served by the test cluster (no cert-manager): rendered and linted, not dry-run.
CERT_MANAGER_KINDS = {"Certificate", "Issuer"}
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

# The values sets every rendering test runs with.
VALUES_SETS: dict[str, dict[str, Any]] = {
    "cluster-wide": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "replicas-2": {"replicas": 2},
    "namespaced-replicas-2": {"replicas": 2, "watchNamespaces": ["team-a", "team-b"]},
    "cert-manager": {"progress": {"enabled": True, "port": 8443, "certManager": {"enabled": True}}},
    "cert-manager-issuer": {"replicas": 2, "progress": {"enabled": True, "port": 9443, "certManager": {
        "enabled": True, "issuerRef": {"kind": "ClusterIssuer", "name": "internal-ca"}}}},
    "no-progress": {"progress": {"enabled": False, "port": 8443}},
    "metrics-servicemonitor": {
        "metrics": {"enabled": True, "port": 9090, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "logFormat": "json",
        "runtime": {"image": "registry.example.com/rt:0.1.0"},
    },
    "monitoring": {"metrics": {"enabled": True, "port": 9090, "serviceMonitor": {"enabled": True},
                               "dashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}},
}


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


# -- pure: helm only


@pytest.mark.parametrize("values", VALUES_SETS.values(), ids=VALUES_SETS.keys())
def test_lint_strict(helm: str, values: dict[str, Any]) -> None:
    from tests.chart.conftest import set_args

    run(helm, "lint", "--strict", str(CHART), *set_args(values))


def test_chart_crd_is_identical_to_generated_crd() -> None:
    name = "muralist.dev_diffusionjobs.yaml"
    assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), (
        f"charts/muralist/crds/{name} differs from crds/{name}: cp crds/{name} charts/muralist/crds/"
    )


def test_default_is_cluster_wide_and_restricted(helm: str) -> None:
    docs = render(helm)
    assert sorted(kinds(docs)) == ["ClusterRole"] * 4 + ["ClusterRoleBinding", "ClusterRoleBinding",
                                   "Deployment", "NetworkPolicy", "Role", "RoleBinding", "Service", "Service",
                                   "ServiceAccount"]
    c = container(docs)
    assert c["args"] == ["operator", "--health-port", "8080", "--metrics-port", "9090",
                         "--progress-port", "8443", "--progress-url", "https://muralist-progress.muralist-system.svc:8443",
                         "--progress-service", "muralist-progress", "--progress-max-connections", "4096",
                         "--progress-handshake-timeout", "30", "--progress-request-timeout", "30",
                         "--progress-idle-timeout", "120", "--progress-tls-secret", "muralist-progress-tls",
                         "--log-format", "plain"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 8080, "metrics": 9090, "progress": 8443}
    assert c["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]


def test_namespaced_mode_grants_a_role_per_namespace(helm: str) -> None:
    docs = render(helm, VALUES_SETS["namespaced"])
    for ns in ("team-a", "team-b"):
        role = one(docs, "Role", ns)
        binding = one(docs, "RoleBinding", ns)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"][0]["namespace"] == "muralist-system"
    # Only two small ClusterRoles stay cluster-wide: discovery (CRDs and namespaces, read-only; the nodes'
    # labels, which strategy Auto plans from) and TokenReview for the progress endpoint.
    rules = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "ClusterRole" and not user_role(d)}
    assert {n: {r for rule in rs for r in rule["resources"]} for n, rs in rules.items()} == {
        "muralist-discovery": {"customresourcedefinitions", "namespaces", "nodes"},
        "muralist-tokenreview": {"tokenreviews"},
    }
    assert {v for rule in rules["muralist-discovery"] for v in rule["verbs"]} == {"list", "watch"}
    assert container(docs)["args"][:5] == ["operator", "--namespace", "team-a", "--namespace", "team-b"]


def user_role(doc: dict[str, Any]) -> bool:
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in doc["metadata"]["labels"])


def test_user_roles_aggregate_into_the_default_roles_and_can_be_left_out(helm: str) -> None:
    roles = {d["metadata"]["name"]: d for d in render(helm) if d["kind"] == "ClusterRole" and user_role(d)}
    assert set(roles) == {"muralist-edit", "muralist-view"}
    edit = {r for rule in roles["muralist-edit"]["rules"] for r in rule["resources"]}
    assert "diffusionjobs/scale" in edit  # kubectl scale needs the subresource, not only the object
    view_verbs = {v for rule in roles["muralist-view"]["rules"] for v in rule["verbs"]}
    assert view_verbs == {"get", "list", "watch"}
    assert not [d for d in render(helm, {"rbac": {"userRoles": False}}) if d["kind"] == "ClusterRole" and user_role(d)]


def test_no_wildcards_in_rbac(helm: str) -> None:
    for values in VALUES_SETS.values():
        for doc in render(helm, values):
            for rule in doc.get("rules", []):
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster-wide", "namespaced"])
def test_replicas_add_peering_and_pdb(helm: str, namespaced: bool) -> None:
    values: dict[str, Any] = {"replicas": 2, **({"watchNamespaces": ["team-a", "team-b"]} if namespaced else {})}
    docs = render(helm, values)
    args = container(docs)["args"]
    assert args[args.index("--peering") + 1] == "muralist"
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    if namespaced:
        peerings = [d for d in docs if d["kind"] == "KopfPeering"]
        assert sorted(d["metadata"]["namespace"] for d in peerings) == ["team-a", "team-b"]
        assert all(
            "kopfpeerings" in r["resources"] for ns in ("team-a", "team-b") for r in one(docs, "Role", ns)["rules"][-1:]
        )
    else:
        assert one(docs, "ClusterKopfPeering")["metadata"]["name"] == "muralist"
    assert "--peering" not in container(render(helm))["args"]


def test_service_monitor_only_when_the_api_is_served(helm: str) -> None:
    values = VALUES_SETS["metrics-servicemonitor"]
    assert "ServiceMonitor" not in kinds(render(helm, values))
    docs = render(helm, values, extra=["--api-versions", SERVICE_MONITOR_API])
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    args = container(docs)["args"]
    assert args[args.index("--runtime-image") + 1] == "registry.example.com/rt:0.1.0"
    assert args[args.index("--log-format") + 1] == "json"


def test_the_price_per_gpu_hour_reaches_the_operator(helm: str) -> None:
    assert "--price-per-gpu-hour" not in container(render(helm))["args"]
    args = container(render(helm, {"pricePerGpuHour": "2.49"}))["args"]
    assert args[args.index("--price-per-gpu-hour") + 1] == "2.49"
    from muralist_cli import build_parser

    assert build_parser().parse_args(["operator", *args[1:]]).price_per_gpu_hour == 2.49


def test_metrics_off(helm: str) -> None:
    docs = render(helm, {"metrics": {"enabled": False}})
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Service"] == ["muralist-progress"]
    args = container(docs)["args"]
    assert args[args.index("--metrics-port") + 1] == "0"


def test_progress_service_tls_and_rbac_self_managed(helm: str) -> None:
    docs = render(helm)
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "muralist-progress")
    assert svc["spec"]["ports"] == [{"name": "progress", "port": 8443, "targetPort": "progress", "protocol": "TCP"}]
    assert "muralist.dev/progress-active" not in svc["spec"]["selector"]  # one replica: it is the active one
    review = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "muralist-tokenreview")
    assert review["rules"] == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
                                "verbs": ["create"]}]
    role = one(docs, "Role", "muralist-system")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["muralist-progress-tls"],
         "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    # The pods' old credentials are gone from what the operator may do, and no rule hands out more.
    namespaced = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "muralist")["rules"]
    assert not {"serviceaccounts", "roles", "rolebindings"} & {r for rule in namespaced for r in rule["resources"]}
    env = {e["name"] for e in container(docs)["env"]}
    assert {"POD_ID", "POD_NAMESPACE"} <= env


def test_two_replicas_route_progress_to_the_active_one(helm: str) -> None:
    docs = render(helm, {"replicas": 2})
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "muralist-progress")
    assert svc["spec"]["selector"]["muralist.dev/progress-active"] == "true"
    assert "--progress-active-label" in container(docs)["args"]
    rules = one(docs, "Role", "muralist-system")["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]} in rules
    # The operator reads the peering object to know whether kopf has paused it.
    main = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "muralist")
    peering = next(r for r in main["rules"] if "clusterkopfpeerings" in r["resources"])
    assert peering["verbs"] == ["get", "list", "watch", "patch"]


@pytest.mark.parametrize("issuer", [None, {"kind": "ClusterIssuer", "name": "internal-ca"}], ids=["own-ca", "issuer"])
def test_cert_manager_mode(helm: str, issuer: dict[str, str] | None) -> None:
    cm: dict[str, Any] = {"enabled": True, **({"issuerRef": issuer} if issuer else {})}
    docs = render(helm, {"progress": {"enabled": True, "port": 8443, "certManager": cm}})
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    serving = certs["muralist-progress"]["spec"]
    assert serving["secretName"] == "muralist-progress-tls"
    assert serving["dnsNames"] == ["muralist-progress", "muralist-progress.muralist-system",
                                   "muralist-progress.muralist-system.svc",
                                   "muralist-progress.muralist-system.svc.cluster.local"]
    if issuer:
        assert serving["issuerRef"] == issuer and set(certs) == {"muralist-progress"}
        assert "Issuer" not in kinds(docs)
    else:
        # A CA of the chart's own, so that renewing the serving certificate keeps the pods' CA.
        assert serving["issuerRef"] == {"kind": "Issuer", "name": "muralist-progress-ca"}
        assert certs["muralist-progress-ca"]["spec"]["isCA"] is True
        assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "Issuer") == [
            "muralist-progress-ca", "muralist-progress-selfsigned"]
    c = container(docs)
    assert c["args"][c["args"].index("--progress-tls-dir") + 1] == "/etc/muralist/progress-tls"
    assert "--progress-tls-secret" not in c["args"]
    assert {"name": "progress-tls", "mountPath": "/etc/muralist/progress-tls", "readOnly": True} in c["volumeMounts"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "progress-tls", "secret": {"secretName": "muralist-progress-tls"}} in pod["volumes"]
    assert "Role" not in kinds(docs)  # no Secret to manage, no other replica to route around


def test_progress_limits_reach_the_operator(helm: str) -> None:
    from muralist_cli import build_parser
    from muralist_operator.main import progress_limits
    from muralist_operator.progress.connections import Limits

    # The chart's defaults are the endpoint's own, and what a user sets arrives as set.
    assert progress_limits(build_parser().parse_args(container(render(helm))["args"])) == Limits()
    limits = {"maxConnections": 100, "handshakeTimeoutSeconds": 2.5, "requestTimeoutSeconds": 5,
              "idleTimeoutSeconds": 60}
    args = container(render(helm, {"progress": {"enabled": True, "port": 8443, "limits": limits}}))["args"]
    assert progress_limits(build_parser().parse_args(args)) == Limits(100, 2.5, 5, 60)


JOB_PODS = {"podSelector": {"matchExpressions": [{"key": "muralist.dev/job-name", "operator": "Exists"}]}}


@pytest.mark.parametrize(("values", "namespaces"), [
    ({}, {}),
    ({"watchNamespaces": ["team-a", "team-b"]},
     {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}),
], ids=["cluster-wide", "namespaced"])
def test_the_operators_network_policy_admits_job_pods_to_progress_and_anyone_to_metrics(
        helm: str, values: dict[str, Any], namespaces: dict[str, Any]) -> None:
    docs = render(helm, values)
    policy = one(docs, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "muralist-system"
    assert policy["spec"] == {
        "podSelector": {"matchLabels": one(docs, "Deployment")["spec"]["selector"]["matchLabels"]},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{**JOB_PODS, "namespaceSelector": namespaces}], "ports": [{"port": 8443, "protocol": "TCP"}]},
            {"ports": [{"port": 9090, "protocol": "TCP"}]},
        ],
    }
    # And the operator may create each job's policy, in either mode.
    rules = [r for d in docs if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]
    # (and watch them, to create one again that someone deleted).
    assert {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
            "verbs": ["get", "list", "watch", "create"]} in rules


def test_network_policies_follow_their_values(helm: str) -> None:
    from muralist_cli import build_parser
    from muralist_operator.main import settings_from

    def settings(docs: list[dict[str, Any]]) -> Any:
        return settings_from(build_parser().parse_args(container(docs)["args"]))

    assert settings(render(helm)).network_policies is True
    docs = render(helm, {"networkPolicies": {"jobs": False, "operator": False}})
    assert "NetworkPolicy" not in kinds(docs) and settings(docs).network_policies is False
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    docs = render(helm, {"networkPolicies": {"metricsFrom": monitoring}, "progress": {"enabled": False, "port": 8443}})
    assert one(docs, "NetworkPolicy")["spec"]["ingress"] == [
        {"ports": [{"port": 9090, "protocol": "TCP"}], "from": monitoring}]
    docs = render(helm, {"progress": {"enabled": False, "port": 8443}, "metrics": {"enabled": False}})
    assert one(docs, "NetworkPolicy")["spec"]["ingress"] == []  # only the kubelet, from the node


def test_progress_off(helm: str) -> None:
    docs = render(helm, VALUES_SETS["no-progress"])
    args = container(docs)["args"]
    assert args[args.index("--progress-port") + 1] == "0" and "--progress-url" not in args
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Service"] == ["muralist-metrics"]
    assert not [d for d in docs if "tokenreview" in d["metadata"]["name"]]


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"replicas": "two"}, "/replicas"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        ({"logFormat": "xml"}, "/logFormat"),
        ({"runtimeImage": "x"}, "runtimeImage"),
        ({"metrics": {"port": 70000}}, "/metrics/port"),
        ({"metrics": {"prometheusRule": {"itemFailures": {"ratio": 1.5}}}},
         "/metrics/prometheusRule/itemFailures/ratio"),
        ({"metrics": {"prometheusRule": {"restarts": {"window": "an hour"}}}},
         "/metrics/prometheusRule/restarts/window"),
        ({"metrics": {"dashboard": {"labels": {"grafana_dashboard": 1}}}},
         "/metrics/dashboard/labels/grafana_dashboard"),
        ({"progress": {"enabled": True, "port": 8443, "certManager": {"issuerRef": {"kind": "Foo"}}}},
         "/progress/certManager/issuerRef/kind"),
        ({"progress": {"enabled": True, "port": 8443, "certManager": {"duration": "1 year"}}},
         "/progress/certManager/duration"),
        ({"progress": {"enabled": True, "port": 8443, "limits": {"maxConnections": 0}}},
         "/progress/limits/maxConnections"),
        ({"progress": {"enabled": True, "port": 8443, "limits": {"idleTimeoutSeconds": 0}}},
         "/progress/limits/idleTimeoutSeconds"),
        ({"networkPolicies": {"jobs": "yes"}}, "/networkPolicies/jobs"),
        ({"networkPolicies": {"metricsFrom": {"namespaceSelector": {}}}}, "/networkPolicies/metricsFrom"),
    ],
)
def test_schema_refuses_bad_values(helm: str, values: dict[str, Any], error: str) -> None:
    from tests.chart.conftest import set_args

    proc = subprocess.run([helm, "template", "m", str(CHART), *set_args(values)], capture_output=True, text=True)
    assert proc.returncode != 0 and error in proc.stderr, proc.stderr


# -- against the real API server


@pytest.mark.cluster
def test_notes_tell_how_to_submit_a_first_job(control_plane: Any, helm: str) -> None:
    # helm renders NOTES.txt only on install, which asks the cluster for its version.
    out = run(
        helm,
        "install",
        "muralist",
        str(CHART),
        "--dry-run=client",
        "-n",
        "muralist-system",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--set-json",
        'watchNamespaces=["team-a"]',
    )
    notes = out.split("NOTES:", 1)[1]
    assert "kubectl apply -n team-a -f examples/quickstart-cpu.yaml" in notes
    assert "kubectl get dj -n team-a" in notes


def kubectl(control_plane: Any, *args: str, stdin: str | None = None, kubeconfig: Path | None = None) -> str:
    return run(
        str(control_plane.bin_dir / "kubectl"),
        "--kubeconfig",
        str(kubeconfig or control_plane.kubeconfig),
        *args,
        stdin=stdin,
    )


@pytest.fixture(scope="module")
def crds(control_plane: Any) -> Iterator[None]:
    """The chart's CRDs: DiffusionJob and kopf's peerings.

    tests/cluster's session fixture `crd` *creates* the DiffusionJob CRD and fails if it
    exists, so a DiffusionJob CRD created here is deleted again when this module is done.
    """
    name = "crd/diffusionjobs.muralist.dev"
    existed = (
        subprocess.run(
            [str(control_plane.bin_dir / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig), "get", name],
            capture_output=True,
        ).returncode
        == 0
    )
    for path in sorted((CHART / "crds").glob("*.yaml")):
        # --force-conflicts: the cluster tests may have created the CRD with the API client first
        # (another field manager), as an upgrade from a hand-applied CRD would be.
        kubectl(control_plane, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    # Polled, not `kubectl wait --for=condition=Established`: that fails at once ("status.conditions accessor
    # error: <nil>") when it reads a CRD the API server has not given conditions yet (CI, 2026-12-05).
    established = "{range .items[*]}{.status.conditions[?(@.type=='Established')].status} {end}"
    wait_for(
        lambda: subprocess.run(
            [
                str(control_plane.bin_dir / "kubectl"),
                "--kubeconfig",
                str(control_plane.kubeconfig),
                "get",
                name,
                "crd/clusterkopfpeerings.kopf.dev",
                "crd/kopfpeerings.kopf.dev",
                "-o",
                f"jsonpath={established}",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        == ["True"] * 3,
        timeout=30,
        message="the chart's CRDs to be Established",
    )
    # Established can come before discovery serves the resource.
    wait_for(
        lambda: (
            subprocess.run(
                [
                    str(control_plane.bin_dir / "kubectl"),
                    "--kubeconfig",
                    str(control_plane.kubeconfig),
                    "get",
                    "dj",
                    "-A",
                ],
                capture_output=True,
            ).returncode
            == 0
        ),
        timeout=30,
        message="DiffusionJobs to be served",
    )
    yield
    if not existed:
        kubectl(control_plane, "delete", name, "--timeout=60s")


@pytest.fixture
def release_namespace(core_v1: Any) -> Iterator[str]:
    name = f"muralist-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace({"metadata": {"name": name, "labels": {"muralist.dev/test": "true"}}})
    try:
        yield name
    finally:
        core_v1.delete_namespace(name)


@pytest.mark.cluster
@pytest.mark.parametrize("values", VALUES_SETS.values(), ids=VALUES_SETS.keys())
def test_server_side_dry_run_accepts_rendered_manifests(
    control_plane: Any, crds: None, helm: str, release_namespace: str, values: dict[str, Any]
) -> None:
    for ns in values.get("watchNamespaces", []):
        subprocess.run(
            [
                str(control_plane.bin_dir / "kubectl"),
                "--kubeconfig",
                str(control_plane.kubeconfig),
                "create",
                "namespace",
                ns,
            ],
            capture_output=True,
        )  # already there from another case: fine
    # With the ServiceMonitor API announced, so that it renders; it and the PrometheusRule cannot be
    # dry-run here (no Prometheus Operator CRD in the test cluster), so only those are left out.
    docs = render(helm, values, namespace=release_namespace, extra=["--api-versions", SERVICE_MONITOR_API])
    if values.get("metrics", {}).get("serviceMonitor", {}).get("enabled"):
        assert "ServiceMonitor" in kinds(docs)
    accepted = [d for d in docs if d["kind"] not in PROMETHEUS_OPERATOR_KINDS | CERT_MANAGER_KINDS]
    out = kubectl(control_plane, "apply", "--dry-run=server", "-o", "name", "-f", "-", stdin=dump(accepted))
    assert len(out.split()) == len(accepted), out


@pytest.mark.cluster
@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster-wide", "namespaced"])
def test_the_operators_network_policy_selects_it_and_admits_only_job_pods(
        core_v1: Any, helm: str, release_namespace: str, namespaced: bool) -> None:
    """The chart's policy as the API server stores it, evaluated with its own label selectors
    (tests/network_policies.py) over pods made for the purpose."""
    suffix = uuid.uuid4().hex[:8]
    watched, unwatched, monitoring = f"team-{suffix}", f"other-{suffix}", f"monitoring-{suffix}"
    namespaces = [release_namespace, watched, unwatched, monitoring]
    scrapers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": monitoring}}}]
    values: dict[str, Any] = {"networkPolicies": {"metricsFrom": scrapers},
                              **({"watchNamespaces": [watched]} if namespaced else {})}
    docs = render(helm, values, namespace=release_namespace)
    for ns in namespaces[1:]:
        core_v1.create_namespace({"metadata": {"name": ns, "labels": {"muralist.dev/test": "true"}}})
    try:
        for ns in namespaces:
            wait_for(lambda ns=ns: core_v1.read_namespaced_service_account("default", ns), message=f"{ns}/default")
        created = client.NetworkingV1Api(core_v1.api_client).create_namespaced_network_policy(
            release_namespace, one(docs, "NetworkPolicy"))
        policy = core_v1.api_client.sanitize_for_serialization(created)
        operator_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
        pods = {
            (release_namespace, "operator"): operator_labels,
            (release_namespace, "stranger"): {"app": "stranger"},
            (watched, "cats-0"): {"muralist.dev/job-name": "cats"},
            (watched, "web"): {"app": "web"},
            (unwatched, "dogs-0"): {"muralist.dev/job-name": "dogs"},
            (monitoring, "prometheus"): {"app": "prometheus"},
        }
        for (ns, name), labels in pods.items():
            core_v1.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": labels},
                                               "spec": {"containers": [{"name": "c", "image": "example.com/c"}]}})

        assert selected(core_v1, policy) == {(release_namespace, "operator")}
        job_pods = {(watched, "cats-0")} | (set() if namespaced else {(unwatched, "dogs-0")})
        assert admitted(core_v1, policy, namespaces, port=8443) == job_pods
        assert admitted(core_v1, policy, namespaces, port=9090) == {(monitoring, "prometheus")}
        assert admitted(core_v1, policy, namespaces, port=8080) == set()  # health: the kubelet, from the node
    finally:
        for ns in namespaces[1:]:
            core_v1.delete_namespace(ns)


def token_kubeconfig(control_plane: Any, account: str, namespace: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a bound token from TokenRequest)."""
    token = kubectl(control_plane, "create", "token", account, "-n", namespace, "--duration", "1h").strip()
    admin = yaml.safe_load(control_plane.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": cluster}],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": account, "namespace": namespace}}],
                "current-context": "test",
            }
        )
    )
    return path


def exercise_operator(api: Any, namespace: str) -> None:
    """Every kind of call the operator makes: create children, write status, post events,
    follow a failed pod's retry to the job's failure, and delete a finished job after its TTL
    (and, at start, its progress certificate Secret and TokenReviews for the endpoint)."""

    def phase(name: str) -> str | None:
        return (api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}).get(
            "phase"
        )

    def gone(name: str) -> bool:
        try:
            api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            return e.status == 404
        return False

    api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, make_job("cats").run_policy(ttlSecondsAfterFinished=2).obj()
    )
    api.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        make_job("dogs")
        .run_policy(maxRestarts=1)
        .pod_template(annotations=fate_annotations("fail", exit_code=2))
        .obj(),
    )
    wait_for(lambda: phase("cats") == "Succeeded", timeout=90, message="cats to succeed")
    wait_for(lambda: gone("cats"), timeout=30, message="cats to be deleted after its TTL")
    wait_for(lambda: phase("dogs") == "Failed", timeout=90, message="dogs to fail after one restart")
    assert api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "dogs")["status"]["restarts"] == 1


@pytest.mark.cluster
def test_users_bound_to_the_default_roles_may_submit_scale_and_read_jobs(
    control_plane: Any, crds: None, helm: str, namespace: str
) -> None:
    """The aggregation controller (kube-controller-manager) folds the chart's user roles into
    `edit` and `view`: what a RoleBinding to those built-in roles then allows, asked of the API
    server's own authorizer (SubjectAccessReview through `kubectl auth can-i --as`)."""
    release = f"u{uuid.uuid4().hex[:6]}"
    roles = dump(d for d in render(helm, release=release) if d["kind"] == "ClusterRole" and user_role(d))
    kubectl(control_plane, "apply", "-f", "-", stdin=roles)
    users = {"editor": "edit", "viewer": "view"}
    for user, role in users.items():
        kubectl(control_plane, "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
                f"--user={user}", "-n", namespace)

    def can(user: str, verb: str, subresource: str = "") -> bool:
        args = ["auth", "can-i", verb, f"{PLURAL}.{GROUP}", "--as", user, "-n", namespace]
        if subresource:
            args += ["--subresource", subresource]
        answer = subprocess.run([str(control_plane.bin_dir / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig),
                                 *args], capture_output=True, text=True, check=False)
        return answer.stdout.strip() == "yes"

    try:
        wait_for(lambda: can("editor", "patch", "scale") and can("viewer", "list"),
                 timeout=60, message="the user roles to be aggregated into edit and view")
        assert can("editor", "create") and can("editor", "delete")
        assert can("viewer", "get", "status")
        assert not can("viewer", "create")
        assert not can("viewer", "patch", "scale")
    finally:
        kubectl(control_plane, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=roles)


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_operator_works_with_exactly_the_chart_rbac(
    control_plane: Any,
    crds: None,
    kube_api: Any,
    helm: str,
    namespace: str,
    release_namespace: str,
    mode: str,
    tmp_path: Path,
) -> None:
    from kubernetes import client

    watched = [namespace] if mode == "namespaced" else []
    release = f"m{uuid.uuid4().hex[:6]}"
    docs = [
        d
        for d in render(helm, {"watchNamespaces": watched}, release=release, namespace=release_namespace)
        if d["kind"] in RBAC_KINDS
    ]
    rbac = dump(docs)
    kubectl(control_plane, "apply", "-f", "-", stdin=rbac)
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    kubeconfig = token_kubeconfig(control_plane, account, release_namespace, tmp_path / "kubeconfig")
    args = [arg for ns in watched for arg in ("--namespace", ns)]
    # The chart's names for the progress Service and certificate Secret (the Role names the
    # Secret); the endpoint itself listens on a free port here.
    chart_args = container(render(helm, {"watchNamespaces": watched}, release=release,
                                  namespace=release_namespace))["args"]
    for flag in ("--progress-service", "--progress-tls-secret"):
        args += [flag, chart_args[chart_args.index(flag) + 1]]
    operator = OperatorProcess(kubeconfig, tmp_path, extra_args=args, operator_namespace=release_namespace)
    operator.start()
    try:
        exercise_operator(client.CustomObjectsApi(kube_api), namespace)
    finally:
        operator.stop()
        kubectl(control_plane, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=rbac)
    logs = operator.logs()
    # A 403 as a status code, not as digits of a port ("port 40397" is no refusal).
    assert not re.search(r"(?<![\d:])403(?!\d)", logs), logs
    for refusal in ("Forbidden", "Not enough permissions"):
        assert refusal not in logs, logs
