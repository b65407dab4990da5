"""A Docker engine for the `docker` and `e2e` tests, set up if the machine has none.

If `docker info` fails, Debian's docker.io and debootstrap are installed with apt (root only)
and dockerd is started for the session. The base image is made locally, without a registry:
`debootstrap --variant=minbase bookworm` imported as muralist-base:bookworm (kept between
sessions). Without a usable engine the tests skip, or fail when MURALIST_REQUIRE_DOCKER=1 (CI).
Each setup step's duration is printed in the terminal summary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import apt, summary_plugin

BASE_IMAGE = "muralist-base:bookworm"
TEST_LABEL = "dev.muralist.test-build=true"
REPO = Path(__file__).resolve().parents[1]
# HTTPS from a build goes through the host's proxy: trust what the host trusts.
EXTRA_CA = Path(os.environ.get("MURALIST_EXTRA_CA", "/etc/ssl/certs/ca-certificates.crt"))
SUMMARY_SECTION = "setup step timings (docker, real node)"


def timed(config: pytest.Config, step: str) -> AbstractContextManager[None]:
    """Time a setup step into the run's summary (tests/summary_plugin.py)."""
    return summary_plugin.timed(config, SUMMARY_SECTION, step)


def unavailable(reason: str) -> None:
    if os.environ.get("MURALIST_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (MURALIST_REQUIRE_DOCKER=1)", pytrace=False)
    pytest.skip(reason)


def sh(*args: str, timeout: float = 600, stdin: bytes | None = None, env: dict[str, str] | None = None,
       check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=stdin is None, input=stdin, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        out = proc.stdout if isinstance(proc.stdout, str) else proc.stdout.decode(errors="replace")
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{err[-4000:]}{out[-2000:]}")
    return proc


@dataclass
class Docker:
    """A docker CLI that can build with BuildKit (the Dockerfile needs secrets and bind mounts)."""

    cli: str
    started: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    env: dict[str, str] = field(default_factory=lambda: {"DOCKER_BUILDKIT": "1"})

    def __call__(self, *args: str, timeout: float = 600, stdin: bytes | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh(self.cli, *args, timeout=timeout, stdin=stdin, env=self.env, check=check)

    def build(self, target: str, tag: str, base: str) -> str:
        """One target of the project's Dockerfile on `base` (both targets' base ARGs)."""
        secret = ["--secret", f"id=extra_ca,src={EXTRA_CA}"] if EXTRA_CA.is_file() else []
        base_args = [f for arg in ("PYTHON_BASE", "RUNTIME_BASE") for f in ("--build-arg", f"{arg}={base}")]
        self("build", "--target", target, *base_args, *secret, "--label", TEST_LABEL, "-t", tag, str(REPO),
             timeout=1800)
        self.prune_replaced_builds()
        return tag

    def prune_replaced_builds(self) -> None:
        """After a build labelled TEST_LABEL: the previous build of its tag is now untagged; drop
        it, or GBs pile up run after run. Docker 20.10 never collects BuildKit's cache either
        (each dependency change left ~6 GB): what the build used is kept (the filter is on last use)."""
        self("image", "prune", "--force", "--filter", f"label={TEST_LABEL}", check=False)
        self("builder", "prune", "--all", "--force", "--filter", "until=72h", check=False)


def engine_up(cli: str) -> bool:
    return subprocess.run([cli, "info"], capture_output=True, timeout=30).returncode == 0


def buildkit_cli() -> str | None:
    """A client with BuildKit: one with the buildx plugin, or Docker 20.10-22.x, whose
    `docker build` has BuildKit built in (newer clients without buildx cannot use it)."""
    candidates = [c for c in (shutil.which("docker"), "/usr/bin/docker") if c and os.access(c, os.X_OK)]
    for cli in dict.fromkeys(candidates):
        if subprocess.run([cli, "buildx", "version"], capture_output=True).returncode == 0:
            return cli
        version = subprocess.run([cli, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True)
        major = version.stdout.strip().split(".")[0]
        if major.isdigit() and int(major) < 23:
            return cli
    return None


def install_docker(config: pytest.Config) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        unavailable("no Docker engine, and docker.io cannot be installed here (needs root and apt-get)")
    with timed(config, "apt-get install docker.io debootstrap"):
        failed = apt.install(["docker.io", "debootstrap"])
    if failed:
        raise AssertionError(failed)


def start_dockerd(config: pytest.Config, cli: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = Path(tempfile.gettempdir()) / f"muralist-dockerd-{os.getpid()}.log"
    with timed(config, "start dockerd"):
        proc = subprocess.Popen(["dockerd"], stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 60
        while not engine_up(cli):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                tail = log.read_text(errors="replace")[-3000:]
                unavailable(f"dockerd did not start (log {log}):\n{tail}")
            time.sleep(0.5)
    return proc, log


@pytest.fixture(scope="session")
def docker(pytestconfig: pytest.Config) -> Iterator[Docker]:
    cli = buildkit_cli()
    if cli is None or not engine_up(cli):
        if shutil.which("dockerd") is None:
            install_docker(pytestconfig)
        cli = buildkit_cli()
        if cli is None:
            unavailable("no docker CLI with BuildKit (install docker-buildx, or Debian's docker.io)")
    engine = Docker(cli)
    if not engine_up(cli):
        engine.started, engine.log = start_dockerd(pytestconfig, cli)
    try:
        yield engine
    finally:
        if engine.started is not None:  # ours: stop it; images stay in /var/lib/docker for next time
            engine.started.terminate()
            engine.started.wait(timeout=30)


@pytest.fixture(scope="session")
def base_image(docker: Docker, pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Debian bookworm (minbase) as a local image: no registry is reachable from CI."""
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    if shutil.which("debootstrap") is None:
        install_docker(pytestconfig)
    root = tmp_path_factory.mktemp("bookworm")
    with timed(pytestconfig, "debootstrap --variant=minbase bookworm"):
        sh("debootstrap", "--variant=minbase", "bookworm", str(root), timeout=900)
    with timed(pytestconfig, f"docker import {BASE_IMAGE}"):
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run([docker.cli, "import", "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True,
                                  text=True, timeout=600)
        tar.wait()
        assert imported.returncode == 0, imported.stderr
    shutil.rmtree(root, ignore_errors=True)
    return BASE_IMAGE
