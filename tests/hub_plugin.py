"""No test reaches the real Hugging Face Hub: every one talks to tests/hub_server.py instead.

`huggingface_hub` reads HF_ENDPOINT once, when it is imported, so this points it at a loopback
port at configure time, before any test module is imported, and for every process a test
spawns (they inherit the environment). The port is bound at once but listened on only when a
test asks for `hub_server`: until then a stray hub call is refused at once instead of going
out to huggingface.co. No developer's token reaches a test either: HF_TOKEN is dropped and
the token file is one that does not exist. Runtime tests that need no network also set
HF_HUB_OFFLINE (tests/runtime/conftest.py).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hub_server import HubServer

_SOCKET = pytest.StashKey[socket.socket]()


def pytest_configure(config: pytest.Config) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config.stash[_SOCKET] = sock
    os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
    os.environ.pop("HF_TOKEN", None)
    os.environ["HF_TOKEN_PATH"] = str(Path(tempfile.gettempdir()) / f"muralist-tests-{os.getpid()}" / "no-token")
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    loopback = "127.0.0.1,localhost"  # the stand-in and its "CDN" must never go through a proxy
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(
        p for p in (os.environ.get("NO_PROXY") or os.environ.get("no_proxy"), loopback) if p)


def pytest_unconfigure(config: pytest.Config) -> None:
    sock = config.stash.get(_SOCKET, None)
    if sock is not None:
        sock.close()


@pytest.fixture(scope="session")
def hub_server(pytestconfig: pytest.Config) -> Iterator[HubServer]:
    """The stand-in, serving on HF_ENDPOINT; tests add repos and tokens to it and `reset()` it."""
    server = HubServer(pytestconfig.stash[_SOCKET]).start()
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None and server.url != hub.ENDPOINT:
        pytest.fail(f"huggingface_hub was imported before HF_ENDPOINT was set ({hub.ENDPOINT}); in-process hub "
                    "calls would miss the stand-in")
    try:
        yield server
    finally:
        server.stop()
