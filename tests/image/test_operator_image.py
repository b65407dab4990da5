"""The operator image, built for real from the Dockerfile on a local Debian base, then run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docker_plugin import Docker, timed

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
IMAGE = "muralist-operator:test"


@pytest.fixture(scope="module")
def operator_image(docker: Docker, base_image: str, pytestconfig: pytest.Config) -> str:
    with timed(pytestconfig, "docker build --target operator"):
        return docker.build("operator", IMAGE, base_image)


def run(docker: Docker, image: str, *args: str, entrypoint: str | None = None, volumes: tuple[str, ...] = ()) -> str:
    # The same restrictions as the chart's securityContext.
    flags = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--tmpfs", "/tmp"]
    flags += [f for v in volumes for f in ("-v", v)]
    if entrypoint:
        flags += ["--entrypoint", entrypoint]
    return docker("run", "--rm", *flags, image, *args, timeout=120).stdout


def test_help_lists_the_commands(docker: Docker, operator_image: str) -> None:
    out = run(docker, operator_image, "--help")
    for command in ("operator", "validate", "render", "crd"):
        assert command in out


def test_validates_the_examples(docker: Docker, operator_image: str) -> None:
    examples = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
    assert examples
    # The glob is expanded here: the container has no shell in between.
    out = run(docker, operator_image, "validate", *(f"/examples/{name}" for name in examples),
              volumes=(f"{REPO / 'examples'}:/examples:ro",))
    assert len(out.strip().splitlines()) >= len(examples), out


def test_runs_as_uid_1000(docker: Docker, operator_image: str) -> None:
    assert run(docker, operator_image, "-u", entrypoint="id").strip() == "1000"


def test_has_no_torch(docker: Docker, operator_image: str) -> None:
    code = "import importlib.util as u; print(u.find_spec('torch') is None, u.find_spec('kopf') is not None)"
    assert run(docker, operator_image, "-c", code, entrypoint="python3").split() == ["True", "True"]


def test_the_progress_endpoint_and_its_certificates_load(docker: Docker, operator_image: str) -> None:
    # httptools (the endpoint's HTTP parser) and cryptography (the self-managed CA) are in the image.
    code = ("from muralist_operator.progress.tls import issue, new_ca; import muralist_operator.main, httptools; "
            "ca, key = new_ca(); print(issue(['muralist-progress'], ca, key).cert_pem[:27].decode())")
    assert run(docker, operator_image, "-c", code, entrypoint="python3").strip() == "-----BEGIN CERTIFICATE-----"
