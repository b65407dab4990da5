"""A real S3-compatible server on loopback for the object-storage tests: moto's server mode.

moto (`moto.server.ThreadedMotoServer`) is pure Python and comes with the dev extra: no Go build
and no binary to cache, unlike MinIO, and it speaks the S3 REST API over HTTP the way a bucket
does (ranged GETs, PUTs, listings), so s3fs, botocore and pyarrow go through their real code.
It starts once per session, on a port picked then, only when a test asks for `s3_server`
(loopback) or, in tests/e2e, `pod_s3_server` (the real node's bridge gateway, where its pods reach it).

Processes a test spawns (torchrun's workers) reach it through the environment that `S3Server.env`
gives them: the endpoint is in the manifest (spec.*.endpoint), the credentials in AWS_* variables,
as a Secret's keys are in a pod's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# moto accepts any credentials; these stand for a Secret's keys.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "muralist-test", "AWS_SECRET_ACCESS_KEY": "muralist-test-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class S3Server:
    endpoint: str
    server: Any

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach the server (with the endpoint from the manifest)."""
        return dict(CREDENTIALS)

    def filesystem(self) -> Any:
        """An s3fs file system on the server, without cached listings (tests look after each write)."""
        import s3fs

        return s3fs.S3FileSystem(key=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                 client_kwargs={"endpoint_url": self.endpoint},
                                 use_listings_cache=False, skip_instance_cache=True)

    def bucket(self) -> str:
        """A new empty bucket, so tests sharing the server never see each other's objects."""
        name = f"muralist-{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(name)  # no region: us-east-1, which takes no LocationConstraint
        return name


def _free_port(ip_address: str) -> int:
    with socket.socket() as s:
        s.bind((ip_address, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(ip_address: str) -> Iterator[S3Server]:
    """moto's S3 on `ip_address` (a free port), with this process's AWS_* variables pointing at it
    while it runs. Loopback for processes of this machine; the pods of the real node reach it at
    their bridge's gateway (tests/e2e)."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO: a failed test's report would be thousands of lines of it.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = _free_port(ip_address)
    server = ThreadedMotoServer(ip_address=ip_address, port=port, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        yield S3Server(f"http://{ip_address}:{port}", server)
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 on 127.0.0.1."""
    with serve("127.0.0.1") as server:
        yield server
