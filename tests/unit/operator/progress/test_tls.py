"""The progress server's certificate: issued, checked, kept in a Secret (fake API), or mounted."""

from __future__ import annotations

import base64
import copy
import datetime
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client
from kubernetes.client.rest import ApiException
from muralist_operator.progress.tls import (
    CERT_VALIDITY,
    ensure_certificate,
    issue,
    new_ca,
    problem,
    read_mounted,
    server_context,
    service_names,
)

NAMES = service_names("muralist-progress", "muralist-system")
NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)


def test_service_names() -> None:
    assert NAMES == ["muralist-progress", "muralist-progress.muralist-system", "muralist-progress.muralist-system.svc",
                     "muralist-progress.muralist-system.svc.cluster.local"]


def test_issued_certificate_names_the_service_and_chains_to_the_ca() -> None:
    ca_pem, ca_key = new_ca(NOW)
    material = issue(NAMES, ca_pem, ca_key, NOW)
    cert = x509.load_pem_x509_certificate(material.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert sans == NAMES
    assert material.not_after == NOW + CERT_VALIDITY
    assert problem(material, NAMES, NOW) is None
    server_context(material)  # OpenSSL accepts the pair


@pytest.mark.parametrize(
    "change, why",
    [
        ("near expiry", "expires"),
        ("another service", "does not name"),
        ("another CA", "not signed by the CA"),
        ("another key", "key does not match"),
    ],
)
def test_problem_says_why_to_reissue(change: str, why: str) -> None:
    ca_pem, ca_key = new_ca(NOW)
    material = issue(NAMES, ca_pem, ca_key, NOW)
    now = NOW
    if change == "near expiry":
        now = NOW + CERT_VALIDITY - datetime.timedelta(days=10)
    elif change == "another service":
        material = issue(service_names("other", "muralist-system"), ca_pem, ca_key, NOW)
    elif change == "another CA":
        material = type(material)(material.cert_pem, material.key_pem, new_ca(NOW)[0], material.not_after)
    else:
        other = issue(NAMES, ca_pem, ca_key, NOW)
        material = type(material)(material.cert_pem, other.key_pem, ca_pem, material.not_after)
    found = problem(material, NAMES, now)
    assert found is not None and why in found


class FakeSecrets:
    """read/create/replace of Secrets with resourceVersion conflicts, like the API server."""

    def __init__(self) -> None:
        self.store: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.writes: list[str] = []
        self.before_create: Any = None

    def read_namespaced_secret(self, name: str, namespace: str) -> client.V1Secret:
        doc = self.store.get((namespace, name))
        if doc is None:
            raise ApiException(status=404, reason="Not Found")
        meta = client.V1ObjectMeta(name=name, resource_version=doc["metadata"]["resourceVersion"])
        return client.V1Secret(metadata=meta, data=dict(doc["data"]), type=doc["type"])

    def _put(self, namespace: str, body: dict[str, Any]) -> None:
        self.version += 1
        doc = copy.deepcopy(body)
        doc["metadata"]["resourceVersion"] = str(self.version)
        self.store[(namespace, body["metadata"]["name"])] = doc

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any]) -> None:
        if self.before_create is not None:
            self.before_create()
        if (namespace, body["metadata"]["name"]) in self.store:
            raise ApiException(status=409, reason="AlreadyExists")
        self.writes.append("create")
        self._put(namespace, body)

    def replace_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        current = self.store[(namespace, name)]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.writes.append("replace")
        self._put(namespace, body)


def ensure(api: FakeSecrets, now: datetime.datetime = NOW) -> Any:
    return ensure_certificate(api, "muralist-system", "muralist-progress-tls", "muralist-progress", now=now)


def test_secret_is_created_then_reused() -> None:
    api = FakeSecrets()
    first = ensure(api)
    second = ensure(api, NOW + datetime.timedelta(days=100))
    assert api.writes == ["create"]
    assert second == first
    doc = api.store[("muralist-system", "muralist-progress-tls")]
    assert doc["type"] == "kubernetes.io/tls"
    assert sorted(doc["data"]) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert base64.b64decode(doc["data"]["ca.crt"]) == first.ca_pem


def test_renewal_keeps_the_ca_that_running_jobs_trust() -> None:
    api = FakeSecrets()
    first = ensure(api)
    later = NOW + CERT_VALIDITY - datetime.timedelta(days=5)
    renewed = ensure(api, later)
    assert api.writes == ["create", "replace"]
    assert renewed.ca_pem == first.ca_pem
    assert renewed.cert_pem != first.cert_pem
    assert renewed.not_after == later + CERT_VALIDITY
    assert problem(renewed, NAMES, later) is None


def test_a_replica_that_loses_the_create_race_uses_the_winners_certificate() -> None:
    api = FakeSecrets()
    winner = FakeSecrets()
    theirs = ensure(winner)

    def other_replica_first() -> None:
        api.before_create = None
        api.store.update(winner.store)

    api.before_create = other_replica_first
    mine = ensure(api)
    assert mine.cert_pem == theirs.cert_pem
    assert api.writes == []


def test_cert_manager_mount_is_read_as_is(tmp_path: Path) -> None:
    ca_pem, ca_key = new_ca(NOW)
    material = issue(NAMES, ca_pem, ca_key, NOW)
    (tmp_path / "tls.crt").write_bytes(material.cert_pem)
    (tmp_path / "tls.key").write_bytes(material.key_pem)
    assert read_mounted(tmp_path).ca_pem is None  # a public issuer: pods use their trust store
    (tmp_path / "ca.crt").write_bytes(ca_pem)
    mounted = read_mounted(tmp_path)
    assert mounted == material
    assert mounted.fingerprint == material.fingerprint
    assert isinstance(server_context(mounted), ssl.SSLContext)


def test_extra_names_and_addresses_are_added_under_the_same_ca() -> None:
    # An operator outside the cluster (tests, the real-node e2e) is reached by a name or an IP
    # address of its machine: the certificate is re-issued to name them too, the CA stays.
    api = FakeSecrets()
    first = ensure(api)
    extra = ["localhost", "10.88.0.1"]
    more = ensure_certificate(api, "muralist-system", "muralist-progress-tls", "muralist-progress", now=NOW,
                              extra_names=extra)
    assert api.writes == ["create", "replace"] and more.ca_pem == first.ca_pem
    san = x509.load_pem_x509_certificate(more.cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["10.88.0.1"]
    assert problem(more, [*NAMES, *extra], NOW) is None
    ensure_certificate(api, "muralist-system", "muralist-progress-tls", "muralist-progress", now=NOW,
                       extra_names=extra)
    assert api.writes == ["create", "replace"]  # named already: reused
