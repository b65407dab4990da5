"""Progress posts against the real API server: projected tokens, TokenReview, pod binding.

The verifier runs as an "operator" ServiceAccount holding exactly the rules the chart must
grant it for this (see RULES), not as the test's cluster admin.
"""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from muralist_api.contract.progress import ProgressReport
from muralist_operator.progress.auth import (
    COMPLETION_INDEX,
    LABEL_JOB,
    TokenVerifier,
    api_job_lookup,
    api_pod_lookup,
)
from muralist_operator.progress.server import ProgressServer, client_context
from muralist_operator.progress.tls import TlsMaterial, ensure_certificate, service_names

from tests.kube_helpers import fate_annotations, wait_for

pytestmark = pytest.mark.cluster

SERVICE = "muralist-progress"
SECRET = "muralist-progress-tls"
# What the operator needs for progress: TokenReview (cluster-scoped), and its certificate Secret
# in its own namespace. Reading pods and Jobs is here only because the test looks them up over the
# API; the operator reads them from its kopf indexes (list/watch, already granted).
CLUSTER_RULES = [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]
NAMESPACE_RULES = [
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
]


def report(pod: str, index: int = 0, completed: int = 1) -> dict[str, Any]:
    return {"pod": pod, "index": index, "attempt": 0, "ranks": 1, "completed": completed, "skipped": 0, "failed": 0,
            "total": 4, "lastStepTime": "2026-12-01T12:00:00Z", "lastImageTime": None,
            "sentAt": "2026-12-01T12:00:01Z", "final": False}


class SniConnection(http.client.HTTPSConnection):
    def __init__(self, port: int, context: ssl.SSLContext, sni: str) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=10)
        self._sni = sni

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._sni)  # type: ignore[attr-defined]


@dataclass
class Setup:
    namespace: str
    core: client.CoreV1Api
    verifier: TokenVerifier
    authentication: client.AuthenticationV1Api
    operator_core: client.CoreV1Api
    tls: TlsMaterial
    server: ProgressServer
    conn: SniConnection
    reports: list[tuple[str, str, ProgressReport]] = field(default_factory=list)

    def job_pod(self, job: str, index: int = 0, completions: int = 1) -> tuple[str, str]:
        """The pod of `index` that the Job controller made for an Indexed Job `job` (labelled as a
        diffusionjob's, as the operator's are; created on first use), kept Running by kwok: (name, uid)."""
        batch = client.BatchV1Api(self.core.api_client)
        try:
            batch.create_namespaced_job(self.namespace, {
                "metadata": {"name": job, "labels": {LABEL_JOB: job}},
                "spec": {"completionMode": "Indexed", "completions": completions, "parallelism": completions,
                         "template": {
                             "metadata": {"labels": {LABEL_JOB: job}, "annotations": fate_annotations("run")},
                             "spec": {"serviceAccountName": "runner", "restartPolicy": "Never",
                                      "containers": [{"name": "main", "image": "muralist-runtime:test"}]}}}})
        except ApiException as e:
            if e.status != 409:
                raise

        def made() -> Any:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"job-name={job},batch.kubernetes.io/job-completion-index={index}")
            return next((p for p in pods.items if p.status.phase == "Running" and not p.metadata.deletion_timestamp),
                        None)

        pod = wait_for(made, timeout=30, message=f"the Job's pod of index {index}")
        return pod.metadata.name, pod.metadata.uid

    def pod(self, name: str, job: str, index: int, namespace: str | None = None) -> str:
        """A pod labelled as one of `job` at completion `index`, but no Job's (anyone who may create
        pods can make one), kept Running by kwok; returns its uid."""
        body = {
            "metadata": {"name": name, "labels": {LABEL_JOB: job},
                         "annotations": {**fate_annotations("run"), COMPLETION_INDEX: str(index)}},
            "spec": {"serviceAccountName": "runner", "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "muralist-runtime:test"}]},
        }
        return self.core.create_namespaced_pod(namespace or self.namespace, body).metadata.uid

    def token(self, pod: str, uid: str, audience: str = "muralist.dev", namespace: str | None = None) -> str:
        """What the kubelet mounts from a projected serviceAccountToken volume."""
        spec = {"audiences": [audience], "expirationSeconds": 600,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid}}
        ns = namespace or self.namespace
        return self.core.create_namespaced_service_account_token("runner", ns, {"spec": spec}).status.token

    def post(self, job: str, body: dict[str, Any], token: str | None, namespace: str | None = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        path = f"/v1/namespaces/{namespace or self.namespace}/diffusionjobs/{job}/progress"
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        resp = self.conn.getresponse()
        text = resp.read()
        return resp.status, json.loads(text) if text else None


@contextmanager
def operator_client(kube_api: Any, core: client.CoreV1Api, namespace: str) -> Iterator[client.ApiClient]:
    """An ApiClient authenticated as ServiceAccount `operator` with exactly the rules above."""
    rbac = client.RbacAuthorizationV1Api(kube_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "operator"}})
    subject = [{"kind": "ServiceAccount", "name": "operator", "namespace": namespace}]
    cluster_name = f"muralist-progress-test-{namespace}"
    rbac.create_cluster_role({"metadata": {"name": cluster_name}, "rules": CLUSTER_RULES})
    rbac.create_cluster_role_binding({"metadata": {"name": cluster_name}, "subjects": subject,
                                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": cluster_name}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "operator"}, "rules": NAMESPACE_RULES})
    rbac.create_namespaced_role_binding(namespace, {"metadata": {"name": "operator"}, "subjects": subject,
                                                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                                "kind": "Role", "name": "operator"}})
    token = core.create_namespaced_service_account_token(
        "operator", namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    config = client.Configuration()
    config.host = kube_api.configuration.host
    config.ssl_ca_cert = kube_api.configuration.ssl_ca_cert
    config.api_key = {"authorization": f"Bearer {token}"}
    api = client.ApiClient(config)
    try:
        yield api
    finally:
        api.close()
        rbac.delete_cluster_role_binding(cluster_name)
        rbac.delete_cluster_role(cluster_name)


@pytest.fixture
def setup(kube_api: Any, core_v1: client.CoreV1Api, namespace: str) -> Iterator[Setup]:
    core_v1.create_namespaced_service_account(namespace, {"metadata": {"name": "runner"}})
    with operator_client(kube_api, core_v1, namespace) as api:
        as_operator = client.CoreV1Api(api)
        # RBAC takes effect a moment after the binding is created.
        tls = wait_for(lambda: ensure_certificate(as_operator, namespace, SECRET, SERVICE), timeout=30,
                       message="the certificate Secret")
        authentication = client.AuthenticationV1Api(api)
        verifier = TokenVerifier(authentication, api_pod_lookup(as_operator),
                                 api_job_lookup(client.BatchV1Api(api)))
        reports: list[tuple[str, str, ProgressReport]] = []
        server = ProgressServer(verifier, lambda ns, job, r: reports.append((ns, job, r)), tls,
                                host="127.0.0.1", port=0).start()
        conn = SniConnection(server.port, client_context(tls.ca_pem or b""), service_names(SERVICE, namespace)[2])
        try:
            yield Setup(namespace, core_v1, verifier, authentication, as_operator, tls, server, conn, reports)
        finally:
            conn.close()
            server.stop()


def test_the_certificate_secret_is_reused_by_the_next_replica(setup: Setup) -> None:
    again = ensure_certificate(setup.operator_core, setup.namespace, SECRET, SERVICE)
    assert again.fingerprint == setup.tls.fingerprint
    secret = setup.core.read_namespaced_secret(SECRET, setup.namespace)
    assert secret.type == "kubernetes.io/tls" and sorted(secret.data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]


def test_a_pod_of_the_job_is_accepted_with_one_token_review(setup: Setup) -> None:
    name, uid = setup.job_pod("cats")
    token = setup.token(name, uid)
    for completed in (1, 2, 3):
        assert setup.post("cats", report(name, completed=completed), token) == (204, None)
    assert [(ns, job, r.pod, r.completed) for ns, job, r in setup.reports] == [
        (setup.namespace, "cats", name, c) for c in (1, 2, 3)
    ]
    assert setup.verifier.reviews == 1


def test_a_pod_that_the_jobs_job_does_not_own_is_forbidden(setup: Setup) -> None:
    # Labelled as the job's pod of index 0, by someone who may create pods: no Job made it, so its
    # posts could fake the job's progress (or take over index 0's slot).
    setup.job_pod("cats")  # the job's Job and its own pod exist
    uid = setup.pod("cats-0-forged", "cats", 0)
    status, body = setup.post("cats", report("cats-0-forged"), setup.token("cats-0-forged", uid))
    assert status == 403
    assert f"pod {setup.namespace}/cats-0-forged is not owned by the Job of diffusionjob cats" in body["error"]
    assert setup.reports == []


def test_a_pod_of_another_job_is_forbidden(setup: Setup) -> None:
    uid = setup.pod("cats-0", "cats", 0)
    status, body = setup.post("dogs", report("cats-0"), setup.token("cats-0", uid))
    assert status == 403 and "is not a pod of diffusionjob dogs" in body["error"]
    assert setup.reports == []


def test_a_pod_of_another_namespace_is_forbidden(setup: Setup, core_v1: client.CoreV1Api) -> None:
    other = f"t-{uuid.uuid4().hex[:10]}"
    core_v1.create_namespace({"metadata": {"name": other, "labels": {"muralist.dev/test": "true"}}})
    try:
        core_v1.create_namespaced_service_account(other, {"metadata": {"name": "runner"}})
        uid = setup.pod("cats-0", "cats", 0, namespace=other)
        token = setup.token("cats-0", uid, namespace=other)
        status, body = setup.post("cats", report("cats-0"), token)  # to the first namespace's job cats
        assert status == 403 and f"pod {other}/cats-0 cannot post for namespace {setup.namespace}" in body["error"]
    finally:
        core_v1.delete_namespace(other)


def test_another_audience_is_unauthenticated(setup: Setup) -> None:
    uid = setup.pod("cats-0", "cats", 0)
    status, body = setup.post("cats", report("cats-0"), setup.token("cats-0", uid, audience="other.example"))
    assert status == 401
    assert 'token audiences ["other.example"] is invalid for the target audiences ["muralist.dev"]' in body["error"]


def test_no_token_is_unauthenticated(setup: Setup) -> None:
    assert setup.post("cats", report("cats-0"), None) == (401, {"error": "no bearer token"})


def test_a_token_of_a_deleted_pod_is_refused(setup: Setup) -> None:
    name, uid = setup.job_pod("cats", index=1, completions=2)
    token = setup.token(name, uid)
    assert setup.post("cats", report(name, index=1), token)[0] == 204
    setup.core.delete_namespaced_pod(name, setup.namespace, grace_period_seconds=0)

    def gone() -> bool:
        try:
            setup.core.read_namespaced_pod(name, setup.namespace)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(gone, timeout=30, message=f"pod {name} deleted")
    # The cached verdict does not outlive the pod: the binding check refuses at once.
    status, body = setup.post("cats", report(name, index=1), token)
    assert status == 401 and "no longer exists" in body["error"]

    # The API server itself refuses the token too, but only once its own token cache (10 s for
    # successes) lets go: a verifier without a cache of its own sees "authenticated" for a while.
    fresh = TokenVerifier(setup.authentication, api_pod_lookup(setup.core),
                          api_job_lookup(client.BatchV1Api(setup.core.api_client)), positive_ttl=0)
    verdict = wait_for(lambda: (v := fresh.authenticate(token)).status == 401 and v, timeout=30,
                       message="TokenReview to refuse the deleted pod's token")
    assert "service account token has been invalidated" in verdict.reason
