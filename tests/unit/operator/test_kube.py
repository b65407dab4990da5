"""The operator's API calls against a server that accepts connections and never answers: each
call gives up after its timeout and a bounded number of retries."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus

import pytest
from kubernetes import client
from muralist_operator.kube import REQUEST_TIMEOUT, Kube, TimedApiClient
from muralist_operator.progress import auth
from urllib3.exceptions import MaxRetryError


class Silent:
    """A TCP server on loopback that accepts, reads what it is sent, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                self.requests += data.count(b"HTTP/1.1\r\n")
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    try:
        yield server
    finally:
        server.close()


def test_every_call_has_a_timeout_by_default() -> None:
    assert TimedApiClient.request_timeout == REQUEST_TIMEOUT
    connect, read = REQUEST_TIMEOUT
    assert 0 < connect <= 10 and 0 < read <= 30


def test_a_call_to_a_server_that_never_answers_gives_up_after_one_retry(silent: Silent) -> None:
    config = client.Configuration(host=f"http://127.0.0.1:{silent.port}")
    kube = Kube.connect(configuration=config)
    api = kube.custom.api_client
    assert isinstance(api, TimedApiClient) and api is kube.core.api_client is kube.authentication.api_client
    api.request_timeout = (1.0, 0.5)  # the defaults' mechanism, quicker
    started = time.monotonic()
    with pytest.raises(MaxRetryError):
        kube.get_diffusion_job("ns", "cats")
    elapsed = time.monotonic() - started
    # Two reads of 0.5 s (the call and its one retry), a backoff between them: not forever.
    assert 1.0 <= elapsed < 5.0
    assert silent.requests == 2
    # A status write (PATCH) is retried the same way: every call of ours is safe to repeat.
    with pytest.raises(MaxRetryError):
        kube.patch_status("ns", "cats", {"phase": "Running"})
    assert silent.requests == 4


def test_a_token_review_that_gets_no_answer_is_a_503_within_its_own_timeout(
        silent: Silent, monkeypatch: pytest.MonkeyPatch) -> None:
    kube = Kube.connect(configuration=client.Configuration(host=f"http://127.0.0.1:{silent.port}"))
    monkeypatch.setattr(auth, "REVIEW_TIMEOUT", (1.0, 0.3))  # auth.REVIEW_TIMEOUT's mechanism, quicker
    verifier = auth.TokenVerifier(kube.authentication, lambda _ns, _name: None, lambda _ns, _name: None)
    started = time.monotonic()
    verdict = verifier.authenticate("a-token")
    assert time.monotonic() - started < 3.0
    assert (verdict.status, verdict.reason) == (
        HTTPStatus.SERVICE_UNAVAILABLE, "TokenReview failed: the API server did not answer (MaxRetryError)")
    assert silent.requests == 2 and not verifier.cached("a-token")  # retried once; nothing cached
