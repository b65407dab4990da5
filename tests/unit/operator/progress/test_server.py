"""The progress server over real TLS on a free port, with a stub verifier."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import pytest
from muralist_api.contract.progress import ProgressReport
from muralist_operator.progress.auth import AuthVerdict, Identity
from muralist_operator.progress.connections import DEFAULT_LIMITS, Limits
from muralist_operator.progress.server import ProgressServer, RefusalLog, client_context
from muralist_operator.progress.tls import TlsMaterial, issue, new_ca, service_names

SERVICE, OPERATOR_NS = "muralist-progress", "muralist-system"
SNI = f"{SERVICE}.{OPERATOR_NS}.svc"
PATH = "/v1/namespaces/team-a/diffusionjobs/cats/progress"


def material() -> TlsMaterial:
    return issue(service_names(SERVICE, OPERATOR_NS), *new_ca())


TLS = material()


class StubVerifier:
    """Token "cats-0" is pod cats-0 of job cats in team-a; "dogs-0" a pod of job dogs; "boom" breaks."""

    def cached(self, token: str | None) -> bool:
        return True

    def authenticate(self, token: str | None) -> AuthVerdict:
        if token == "boom":
            raise RuntimeError("the API server is away")
        if token in ("cats-0", "dogs-0"):
            return AuthVerdict(HTTPStatus.OK, "ok", Identity("team-a", "default", token, f"uid-{token}"))
        return AuthVerdict(HTTPStatus.UNAUTHORIZED, "token refused" if token else "no bearer token")

    def authorize(self, identity: Identity, namespace: str, job: str, pod: str, index: int) -> AuthVerdict:
        if not identity.pod_name.startswith(job + "-"):
            return AuthVerdict(HTTPStatus.FORBIDDEN, f"pod {identity.pod_name} is not a pod of diffusionjob {job}")
        if pod != identity.pod_name:
            return AuthVerdict(HTTPStatus.FORBIDDEN, f"cannot post as pod {pod}")
        return AuthVerdict(HTTPStatus.OK, "ok", identity)


class SniConnection(http.client.HTTPSConnection):
    """Connects to 127.0.0.1 but checks the certificate against the Service's DNS name, as a pod does."""

    def __init__(self, port: int, context: ssl.SSLContext, sni: str = SNI) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=10)
        self._sni = sni

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._sni)  # type: ignore[attr-defined]


def body(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"pod": "cats-0", "index": 0, "attempt": 0, "ranks": 2, "completed": 3, "skipped": 0,
                           "failed": 0, "total": 10, "lastStepTime": None, "lastImageTime": "2026-12-01T12:00:00Z",
                           "sentAt": "2026-12-01T12:00:01Z", "final": False}
    doc.update(changes)
    return doc


class Harness:
    def __init__(self, lookups_block: bool = True, limits: Limits = DEFAULT_LIMITS) -> None:
        self.active = True
        self.interval = 3
        self.reports: list[tuple[str, str, ProgressReport]] = []
        self.refusals: list[tuple[str, str, int, str]] = []
        self.fail_report = False
        self.conn: SniConnection  # set once the server listens
        self.server = ProgressServer(
            StubVerifier(), self.on_report, TLS, host="127.0.0.1", port=0, is_active=lambda: self.active,
            job_exists=lambda ns, job: job in ("cats", "dogs"), interval=lambda ns, job: self.interval,
            max_body=2048, lookups_block=lookups_block, coalesce=0.005,  # the default 50 ms, shorter
            limits=limits, on_refusal=lambda *refused: self.refusals.append(refused),
        )

    def on_report(self, namespace: str, job: str, report: ProgressReport) -> None:
        if self.fail_report:
            raise RuntimeError("aggregator broke")
        self.reports.append((namespace, job, report))

    def post(self, payload: Any = None, token: str | None = "cats-0", path: str = PATH,
             content_type: str = "application/json", raw: bytes | None = None,
             authorization: str | None = None) -> tuple[int, Any, http.client.HTTPResponse]:
        data = raw if raw is not None else json.dumps(body() if payload is None else payload).encode()
        headers = {"Content-Type": content_type}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if authorization is not None:
            headers["Authorization"] = authorization
        self.conn.request("POST", path, body=data, headers=headers)
        resp = self.conn.getresponse()
        text = resp.read()
        return resp.status, json.loads(text) if text else None, resp

    def get(self, path: str) -> int:
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        resp.read()
        return resp.status


@pytest.fixture(params=[True, False], ids=["verified-on-a-worker-thread", "verified-inline"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    h = Harness(lookups_block=request.param)
    h.server.start()
    h.conn = SniConnection(h.server.port, client_context(TLS.ca_pem or b""))
    try:
        yield h
    finally:
        h.conn.close()
        h.server.stop()


def test_accepted_report_reaches_the_callback(harness: Harness) -> None:
    status, payload, _ = harness.post()
    assert (status, payload) == (204, None)
    [(namespace, job, report)] = harness.reports
    assert (namespace, job, report.pod, report.completed, report.ranks) == ("team-a", "cats", "cats-0", 3, 2)


def test_backpressure_says_the_interval(harness: Harness) -> None:
    harness.interval = 6.5
    status, payload, _ = harness.post()
    assert (status, payload) == (200, {"intervalSeconds": 6.5})
    assert len(harness.reports) == 1


CASES: dict[str, tuple[dict[str, Any], int, str]] = {
    "no token": ({"token": None}, 401, "no bearer token"),
    "a refused token": ({"token": "forged"}, 401, "token refused"),
    "not a bearer scheme": ({"authorization": "Basic Y2F0czpjYXRz"}, 401, "no bearer token"),
    "no token says nothing about the job": ({"token": None, "path": PATH.replace("cats", "nope")}, 401, "no bearer"),
    "no token says nothing about the body": ({"token": None, "raw": b"{"}, 401, "no bearer token"),
    "a pod of another job": ({"token": "dogs-0"}, 403, "is not a pod of diffusionjob cats"),
    "posting as another pod": ({"payload": body(pod="cats-1")}, 403, "cannot post as pod cats-1"),
    "unknown job": ({"path": PATH.replace("cats", "nope")}, 404, "no diffusionjob team-a/nope"),
    "not JSON": ({"raw": b"{not json"}, 400, "the body is not JSON"),
    "a bad field": ({"payload": body(completed=-1)}, 400, "completed must be >= 0"),
    "not an object": ({"payload": [1]}, 400, "must be a JSON object"),
    "wrong content type": ({"content_type": "text/plain"}, 400, "Content-Type must be application/json"),
    "over the size limit": ({"raw": b" " * 4096}, 413, "at most 2048 bytes"),
    "the verifier fails": ({"token": "boom"}, 503, "cannot verify now"),
}


@pytest.mark.parametrize("request_args, status, error", CASES.values(), ids=CASES.keys())
def test_refusals(harness: Harness, request_args: dict[str, Any], status: int, error: str) -> None:
    got, payload, _ = harness.post(**request_args)
    assert got == status
    assert error in payload["error"]
    assert harness.reports == []
    assert harness.server.responses[status] == 1
    # The job's last error, for status when its posts stop (but a job that does not exist has none).
    namespace_and_job = tuple(request_args.get("path", PATH).split("/")[3:6:2])
    noted = [(namespace_and_job, status)] if status != 404 else []
    assert [((ns, job), st) for ns, job, st, _ in harness.refusals] == noted
    assert all(error in reason or status == 503 for *_, reason in harness.refusals)


def test_callback_failure_is_a_500(harness: Harness) -> None:
    harness.fail_report = True
    status, payload, _ = harness.post()
    assert status == 500 and "could not take the report" in payload["error"]


def test_standby_replica_refuses_and_is_not_ready(harness: Harness) -> None:
    assert harness.get("/readyz") == 200
    harness.active = False
    status, payload, resp = harness.post()
    assert (status, payload["error"], resp.getheader("Retry-After")) == (503, "not the active replica", "5")
    assert harness.refusals == []  # the job's pods are not refused: they reach the other replica
    assert harness.get("/readyz") == 503
    assert harness.get("/healthz") == 200
    harness.active = True
    assert harness.post()[0] == 204


def test_posts_reuse_one_keep_alive_connection(harness: Harness) -> None:
    sockets = set()
    for completed in range(1, 6):
        status, _, resp = harness.post(body(completed=completed))
        assert status == 204 and resp.getheader("Connection", "").lower() != "close"
        assert harness.conn.sock is not None
        sockets.add(harness.conn.sock.getsockname())
    # A refusal keeps the connection too: a pod retrying does not pay for a new handshake.
    assert harness.post(token=None)[0] == 401
    sockets.add(harness.conn.sock.getsockname())
    assert len(sockets) == 1
    assert harness.server.connections_seen == 1
    assert [r.completed for _, _, r in harness.reports] == [1, 2, 3, 4, 5]


def ended_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):  # aborted: a reset, or a TLS record cut short
        return True


def test_over_tls_only_a_pod_that_posted_keeps_its_connection() -> None:
    h = Harness(limits=Limits(handshake_timeout=0.3, request_timeout=0.3, idle_timeout=30))
    h.server.start()
    h.conn = SniConnection(h.server.port, client_context(TLS.ca_pem or b""))
    try:
        assert h.post()[0] == 204
        silent = socket.create_connection(("127.0.0.1", h.server.port), timeout=5)  # never a TLS hello
        shook = client_context(TLS.ca_pem or b"").wrap_socket(  # a handshake, then nothing
            socket.create_connection(("127.0.0.1", h.server.port), timeout=5), server_hostname=SNI)
        with silent, shook:
            assert ended_by_server(silent) and ended_by_server(shook)  # each waits (up to 5 s) for it
        assert h.post()[0] == 204  # the pod's connection outlived both
        assert h.server.connections_seen == 3
        assert h.server.connections_closed == {"handshake timeout": 1, "idle before authenticating": 1}
    finally:
        h.conn.close()
        h.server.stop()


def test_certificate_is_checked_against_the_service_name(harness: Harness) -> None:
    wrong = SniConnection(harness.server.port, client_context(TLS.ca_pem or b""), sni="evil.example")
    with pytest.raises(ssl.SSLCertVerificationError):
        wrong.connect()
    untrusted = SniConnection(harness.server.port, client_context(material().ca_pem or b""))
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusted.connect()


def test_renewed_certificate_serves_new_connections(harness: Harness) -> None:
    renewed = material()
    harness.server.update_tls(renewed)
    fresh = SniConnection(harness.server.port, client_context(renewed.ca_pem or b""))
    try:
        fresh.request("GET", "/readyz")
        assert fresh.getresponse().status == 200
    finally:
        fresh.close()


def test_stop_closes_the_port() -> None:
    h = Harness()
    h.server.start()
    port = h.server.port
    h.server.stop()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_refusals_are_logged_once_per_window(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = RefusalLog(window=60, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="muralist.progress.server"):
        logged = [refusals.refused(403, "team-a", "cats", "not a pod of cats", "10.0.0.1") for _ in range(3)]
        logged.append(refusals.refused(401, "team-a", "cats", "token refused", "10.0.0.2"))
        now[0] = 61
        logged.append(refusals.refused(403, "team-a", "cats", "not a pod of cats", "10.0.0.1"))
    assert logged == [True, False, False, True, True]
    assert [r.getMessage() for r in caplog.records] == [
        "refused a progress post for team-a/cats from 10.0.0.1: 403 not a pod of cats",
        "refused a progress post for team-a/cats from 10.0.0.2: 401 token refused",
        "refused a progress post for team-a/cats from 10.0.0.1: 403 not a pod of cats (2 more like it held back)",
    ]
