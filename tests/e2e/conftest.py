"""A real single-node cluster for the `e2e` tests (marker `e2e`; root, minutes).

The control plane of hack/controlplane.py without kwok nodes, serving the API to pods, plus
hack/real-node.py's node: Debian's containerd/runc/CNI plugins, a locally built pause image,
CoreDNS and kubelet (built by hack/cluster-binaries.sh). The runtime image is built from the
project's Dockerfile on the local Debian base (tests/docker_plugin.py) and imported into
containerd; nothing is pulled. The operator runs as a host process with an admin kubeconfig.

Without root, apt or Docker the tests skip, or fail when MURALIST_REQUIRE_E2E=1 (hack/test.sh).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docker_plugin import Docker, timed
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ, OperatorProcess, apply_crd

REPO = Path(__file__).resolve().parents[2]
RUNTIME_IMAGE = "muralist-runtime:e2e"
PACKAGES = {"containerd": "containerd", "runc": "runc", "/usr/lib/cni/bridge": "containernetworking-plugins"}


def _load_hack_module(name: str, file: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "hack" / file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _unavailable(reason: str) -> None:
    if os.environ.get("MURALIST_REQUIRE_E2E") == "1":
        pytest.fail(f"{reason} (MURALIST_REQUIRE_E2E=1)", pytrace=False)
    pytest.skip(reason)


def _ensure_packages() -> None:
    missing = [pkg for path, pkg in PACKAGES.items() if not (shutil.which(path) or os.path.exists(path))]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        _unavailable(f"{', '.join(missing)} missing and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, capture_output=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", *missing], check=True, capture_output=True, env=env
    )


@dataclass
class RealCluster:
    kubeconfig: Path
    bin_dir: Path
    api: Any  # kubernetes.client.ApiClient, cluster admin
    node: Any  # hack/real-node.py's RealNode
    work: Path

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}{proc.stdout}")
        return proc


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    pytestconfig = request.config
    if os.geteuid() != 0:
        _unavailable("a real node needs root (containerd, network namespaces, iptables)")
    with timed(pytestconfig, "apt-get install containerd runc CNI plugins"):
        _ensure_packages()
    rn = _load_hack_module("muralist_real_node", "real-node.py")
    cpl = rn.cpl
    bin_dir = cpl.default_bin_dir()
    missing = [b for b in (*cpl.BINARIES, "kubelet", "coredns") if not (bin_dir / b).is_file()]
    if missing:
        _unavailable(f"{', '.join(missing)} not in {bin_dir}: run hack/cluster-binaries.sh")
    work = Path(tempfile.mkdtemp(prefix="mn-", dir="/tmp"))  # short: containerd's socket paths
    cp = cpl.ControlPlane(bin_dir, work / "cp", nodes=(), pod_gateway=cpl.POD_GATEWAY)
    node = rn.RealNode(bin_dir, work / "node", cp.kubeconfig)
    failed_before = request.session.testsfailed
    from kubernetes import config

    try:
        with timed(pytestconfig, "real node: control plane up"):
            cp.start()
        with timed(pytestconfig, "real node: containerd, CoreDNS, kubelet up"):
            node.start()
        api = config.new_client_from_config(config_file=str(cp.kubeconfig))
        try:
            yield RealCluster(cp.kubeconfig, bin_dir, api, node, work)
        finally:
            api.close()
    finally:
        with timed(pytestconfig, "real node: down"):
            node.stop()
            cp.stop()
        if request.session.testsfailed > failed_before:
            keep = Path(tempfile.gettempdir()) / f"muralist-e2e-logs-{os.getpid()}"
            shutil.copytree(work / "node" / "logs", keep / "node", dirs_exist_ok=True)
            shutil.copytree(cp.log_dir, keep / "control-plane", dirs_exist_ok=True)
            sys.stderr.write(f"\nreal-node logs kept in {keep}\n")
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def runtime_image(real_cluster: RealCluster, docker: Docker, base_image: str, pytestconfig: pytest.Config) -> str:
    """The project's runtime image (CUDA torch wheels, ~6 GB), built and imported into the node.
    Docker's layer cache and the node's kept image store make both steps quick after the first."""
    with timed(pytestconfig, "docker build --target runtime"):
        docker.build("runtime", RUNTIME_IMAGE, base_image)
    with timed(pytestconfig, "runtime image into containerd"):
        real_cluster.node.load_docker_image(RUNTIME_IMAGE, docker.cli)
    return RUNTIME_IMAGE


@pytest.fixture(scope="session")
def node_base_image(real_cluster: RealCluster, docker: Docker, base_image: str) -> str:
    """The local Debian base (bash, perl) in the node's image store."""
    real_cluster.node.load_docker_image(base_image, docker.cli)
    return base_image


@pytest.fixture(scope="session")
def real_operator(
    real_cluster: RealCluster, runtime_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    apply_crd(real_cluster.api)
    op = OperatorProcess(real_cluster.kubeconfig, tmp_path_factory.mktemp("e2e-operator"), runtime_image=runtime_image)
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def e2e_namespace(real_cluster: RealCluster) -> Iterator[str]:
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), timeout=30, message=f"{name}/default")
    yield name
    core.delete_namespace(name)


@pytest.fixture
def real_dj(real_cluster: RealCluster, e2e_namespace: str, real_operator: OperatorProcess) -> DJ:
    return DJ(real_cluster.api, e2e_namespace)


@pytest.fixture
def host_volume() -> Iterator[Path]:
    """A hostPath directory for a job's output, writable by the pods' uid 1000."""
    path = Path(tempfile.mkdtemp(prefix="muralist-e2e-out-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
