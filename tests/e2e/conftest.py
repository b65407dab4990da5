"""A real single-node cluster for the `e2e` tests (marker `e2e`; root, minutes).

Brought up and down with the same command a person uses, `hack/dev-cluster.sh up --real-node`
(hack/controlplane.py's control plane without kwok nodes, plus hack/real-node.py's node:
Debian's containerd/runc/CNI plugins, a locally built pause image, CoreDNS and kubelet), in a
state dir of the session's own; after `down` the fixture checks that no process, mount,
interface or iptables rule is left. The runtime image is built from the project's Dockerfile on
the local Debian base (tests/docker_plugin.py) and loaded with `dev-cluster.sh load`: nothing is
pulled. The operator runs as a host process with the admin kubeconfig.

Without root or the binaries the tests skip, or fail when MURALIST_REQUIRE_E2E=1 (hack/test.sh).
"""

from __future__ import annotations

import fcntl
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

from tests import summary_plugin
from tests.cluster_plugin import load_controlplane
from tests.docker_plugin import Docker, timed
from tests.kube_helpers import wait_for
from tests.operator_helpers import DJ, OperatorProcess, apply_crd
from tests.s3_plugin import S3Server, serve

REPO = Path(__file__).resolve().parents[2]
DEV_CLUSTER = REPO / "hack" / "dev-cluster.sh"
RUNTIME_IMAGE = "muralist-runtime:e2e"
BRIDGE = "mural0"
RULE_COMMENT = "muralist real node"
REAL_NODE_LOCK = "/tmp/muralist-real-node.lock"


def _unavailable(reason: str) -> None:
    if os.environ.get("MURALIST_REQUIRE_E2E") == "1":
        pytest.fail(f"{reason} (MURALIST_REQUIRE_E2E=1)", pytrace=False)
    pytest.skip(reason)


@dataclass
class RealCluster:
    state_dir: Path
    kubeconfig: Path
    bin_dir: Path
    api: Any  # kubernetes.client.ApiClient, cluster admin

    def dev_cluster_command(self, *args: str) -> tuple[list[str], dict[str, str]]:
        """hack/dev-cluster.sh's argv and environment for this cluster's state dir."""
        env = {**os.environ, "MURALIST_DEV_CLUSTER_DIR": str(self.state_dir), "PYTHON": sys.executable}
        return ["bash", str(DEV_CLUSTER), *args], env

    def dev_cluster(self, *args: str, timeout: float = 900) -> str:
        """hack/dev-cluster.sh on this cluster's state dir; its stderr (the step log) on success."""
        argv, env = self.dev_cluster_command(*args)
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"dev-cluster.sh {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return proc.stderr

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """containerd's CLI on the node's socket, in the namespace kubelet uses."""
        sock = self.state_dir / "node" / "containerd.sock"
        argv = ["ctr", "--address", str(sock), "-n", "k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120)

    def empty_dir(self, pod_uid: str, volume: str) -> Path:
        """Where kubelet keeps a pod's emptyDir volume on this host."""
        return self.state_dir / "node" / "kubelet" / "pods" / pod_uid / "volumes" / "kubernetes.io~empty-dir" / volume

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


def leftovers(state_dir: Path) -> list[str]:
    """What a real node could leave on the host: processes (components, containerd shims, pods),
    mounts, the bridge, iptables rules."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            zombie = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            continue
        if str(state_dir) in cmd and not zombie:
            found.append(f"process {entry.name}: {cmd[:200]}")
    found += [
        f"mount {line.split()[1]}"
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith((f"{state_dir}/", "/run/netns/cni-"))
    ]
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        found.append(f"interface {BRIDGE}")
    for table in ("filter", "nat"):
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True).stdout
        found += [f"iptables -t {table} {rule}" for rule in rules.splitlines() if RULE_COMMENT in rule]
    return found


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    if os.geteuid() != 0:
        _unavailable("a real node needs root (containerd, network namespaces, iptables)")
    cpl = load_controlplane()
    bin_dir = cpl.default_bin_dir()
    missing = [b for b in ("kube-apiserver", "kwokctl", "kubelet", "coredns") if not (bin_dir / b).is_file()]
    if missing:
        _unavailable(f"{', '.join(missing)} not in {bin_dir}: run hack/cluster-binaries.sh")
    # One real node per machine: two would share the image store, the bridge and its iptables
    # rules, and one's `down` breaks the other. A second session waits here for the first.
    lock = open(REAL_NODE_LOCK, "w")  # noqa: SIM115 (held for the whole session)
    fcntl.flock(lock, fcntl.LOCK_EX)
    request.addfinalizer(lock.close)
    state_dir = Path(tempfile.mkdtemp(prefix="mn-", dir="/tmp"))  # short: containerd's socket paths
    cluster = RealCluster(state_dir, cpl.kubeconfig_path(state_dir / "cluster"), bin_dir, None)
    failed_before = request.session.testsfailed
    from kubernetes import config

    try:
        with timed(request.config, "dev-cluster.sh up --real-node"):
            sys.stderr.write(cluster.dev_cluster("up", "--real-node"))
        cluster.api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        yield cluster
    finally:
        if cluster.api is not None:
            cluster.api.close()
        with timed(request.config, "dev-cluster.sh down"):
            cluster.dev_cluster("down")
        if request.session.testsfailed > failed_before:
            keep = Path(tempfile.gettempdir()) / f"muralist-e2e-logs-{os.getpid()}"
            logs = {"cluster": cpl.cluster_dir(state_dir / "cluster") / "logs", "node": state_dir / "node" / "logs"}
            for part, log_dir in logs.items():
                if log_dir.is_dir():
                    shutil.copytree(log_dir, keep / part, dirs_exist_ok=True)
            summary_plugin.note(request.config, "logs kept", "real node", str(keep))
        left = leftovers(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
        assert not left, f"dev-cluster.sh down left behind: {left}"


@pytest.fixture(scope="session")
def runtime_image(real_cluster: RealCluster, docker: Docker, base_image: str, pytestconfig: pytest.Config) -> str:
    """The project's runtime image (CUDA torch wheels, ~6 GB), built and loaded into the node.
    Docker's layer cache and the node's kept image store make both steps quick after the first."""
    with timed(pytestconfig, "docker build --target runtime"):
        docker.build("runtime", RUNTIME_IMAGE, base_image)
    with timed(pytestconfig, "dev-cluster.sh load (runtime image)"):
        sys.stderr.write(real_cluster.dev_cluster("load", RUNTIME_IMAGE))
    return RUNTIME_IMAGE


@pytest.fixture(scope="session")
def node_base_image(real_cluster: RealCluster, docker: Docker, base_image: str) -> str:
    """The local Debian base (bash, perl) in the node's image store."""
    real_cluster.dev_cluster("load", base_image)
    return base_image


@pytest.fixture(scope="session")
def real_operator(
    real_cluster: RealCluster, runtime_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    apply_crd(real_cluster.api)
    # The operator runs on this host: the pods post their progress to it at the bridge's gateway
    # (its self-managed certificate names that address).
    op = OperatorProcess(real_cluster.kubeconfig, tmp_path_factory.mktemp("e2e-operator"), runtime_image=runtime_image,
                         progress_host=load_controlplane().POD_GATEWAY)
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture(scope="session")
def pod_s3_server(real_cluster: RealCluster) -> Iterator[S3Server]:
    """The test S3 server (moto) where the pods reach it: on the bridge's gateway, as the operator's
    progress endpoint. This process reads and writes it there too, with the credentials a
    Secret gives the pods."""
    with serve(load_controlplane().POD_GATEWAY) as server:
        yield server


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
