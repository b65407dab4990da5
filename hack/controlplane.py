#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback for tests and local development.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (which plays the nodes
and the kubelets, with the stages in hack/kwok-stages.yaml) run as local processes on free
ports, from binaries built by hack/cluster-binaries.sh. Standard library only (plus the
`openssl` command for certificates), so it works before any virtualenv exists.

As a module:

    cp = ControlPlane(bin_dir, work_dir)
    cp.start()                 # returns once the API serves, nodes are Ready, etc.
    subprocess.run(["kubectl", "get", "nodes"], env={**os.environ, **cp.env()})
    cp.stop()

As a command (detached processes, state in a directory):

    python3 hack/controlplane.py up   --state-dir DIR [--bin-dir BIN]
    python3 hack/controlplane.py env  --state-dir DIR     # prints export lines
    python3 hack/controlplane.py down --state-dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

HACK_DIR = Path(__file__).resolve().parent
VERSIONS_FILE = HACK_DIR / "versions.env"
STAGES_FILE = HACK_DIR / "kwok-stages.yaml"

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
)
# Stop order: clients of the API first, etcd last, so nothing logs storms of connection errors.
COMPONENT_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"
NODE_IP_PREFIX = "10.250.0."  # fake node addresses: .1, .2, ...
SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
# hack/real-node.py's pod bridge gateway: where pods reach the API server (and CoreDNS).
POD_GATEWAY = "10.88.0.1"
SERVICE_DNS_NAMES = tuple(
    "kubernetes" + suffix for suffix in ("", ".default", ".default.svc", ".default.svc.cluster.local")
)
# EC P-256 keys are fast to generate and accepted by every component.
EC_KEY = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """The control plane could not be started (the message names the component and its log)."""


# --------------------------------------------------------------------------- versions / paths


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse the KEY=value lines of hack/versions.env (the single place versions are pinned)."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip().strip("\"'")
    return versions


def default_bin_dir() -> Path:
    """Where hack/cluster-binaries.sh puts the binaries (MURALIST_K8S_BIN overrides)."""
    if os.environ.get("MURALIST_K8S_BIN"):
        return Path(os.environ["MURALIST_K8S_BIN"])
    cache = os.environ.get("MURALIST_K8S_CACHE") or str(Path.home() / ".cache/muralist/k8s")
    return Path(cache) / read_versions()["K8S_VERSION"] / "bin"


def missing_binaries(bin_dir: Path) -> list[str]:
    return [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]


# --------------------------------------------------------------------------- small utilities


def free_port() -> int:
    # The port is released before the component binds it; on loopback with ephemeral ports
    # handed out in sequence a collision is very unlikely, and start() fails loudly if it happens.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def poll(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
    alive: Callable[[], None] | None = None,
) -> T:
    """Call `check` until it returns something other than None/False, or time out.

    `alive` is called on every round so a component that died fails the wait at once instead
    of after the full timeout.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        if alive is not None:
            alive()
        try:
            result = check()
            if result is not None and result is not False:
                return result
        except (OSError, ValueError, urllib.error.URLError) as exc:  # not up yet
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def openssl(command: str, *extensions: str, cwd: Path) -> None:
    """Run `openssl COMMAND` (split on whitespace), adding each X.509 extension with -addext."""
    args = command.split()
    for extension in extensions:
        args += ["-addext", extension]
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Pki:
    """Certificates and keys of one control plane, generated with the openssl CLI."""

    dir: Path

    ca_crt = property(lambda self: self.dir / "ca.crt")
    ca_key = property(lambda self: self.dir / "ca.key")
    serving_crt = property(lambda self: self.dir / "apiserver.crt")
    serving_key = property(lambda self: self.dir / "apiserver.key")
    admin_crt = property(lambda self: self.dir / "admin.crt")
    admin_key = property(lambda self: self.dir / "admin.key")
    sa_key = property(lambda self: self.dir / "sa.key")
    sa_pub = property(lambda self: self.dir / "sa.pub")

    def generate(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        openssl(
            f"req -x509 {EC_KEY} -keyout ca.key -out ca.crt -subj /CN=muralist-test-ca",
            "basicConstraints=critical,CA:TRUE",
            "keyUsage=critical,keyCertSign,cRLSign",
            cwd=self.dir,
        )
        sans = [f"IP:{ip}" for ip in ("127.0.0.1", SERVICE_IP)] + [
            f"DNS:{name}" for name in ("localhost", *SERVICE_DNS_NAMES)
        ]
        self._leaf("apiserver", "/CN=kube-apiserver", "serverAuth", f"subjectAltName={','.join(sans)}")
        # O=system:masters: the admin identity passes every authorization check.
        self._leaf("admin", "/O=system:masters/CN=muralist-admin", "clientAuth")
        openssl("genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key", cwd=self.dir)
        openssl("pkey -in sa.key -pubout -out sa.pub", cwd=self.dir)

    def _leaf(self, name: str, subject: str, usage: str, *extensions: str) -> None:
        """A certificate signed by the CA (OpenSSL 3's `req -x509 -CA`)."""
        openssl(
            f"req -x509 {EC_KEY} -CA ca.crt -CAkey ca.key -keyout {name}.key -out {name}.crt -subj {subject}",
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
            *extensions,
            cwd=self.dir,
        )


def write_kubeconfig(path: Path, server: str, pki: Pki) -> None:
    """An admin kubeconfig with embedded-by-path certificates (JSON is valid YAML)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "muralist-test",
                "cluster": {"server": server, "certificate-authority": str(pki.ca_crt)},
            }
        ],
        "users": [
            {
                "name": "muralist-admin",
                "user": {
                    "client-certificate": str(pki.admin_crt),
                    "client-key": str(pki.admin_key),
                },
            }
        ],
        "contexts": [
            {
                "name": "muralist-test",
                "context": {
                    "cluster": "muralist-test",
                    "user": "muralist-admin",
                    "namespace": "default",
                },
            }
        ],
        "current-context": "muralist-test",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")


# --------------------------------------------------------------------------- API access


class Api:
    """Just enough of a Kubernetes REST client for bootstrapping (GET/POST JSON)."""

    def __init__(self, server: str, pki: Pki) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=str(pki.ca_crt))
        self.context.load_cert_chain(str(pki.admin_crt), str(pki.admin_key))

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, context=self.context, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.startswith(b"{") else raw.decode()

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
            return True
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise

    def readyz(self) -> bool:
        try:
            return self.request("GET", "/readyz", timeout=3) == "ok"
        except urllib.error.HTTPError:  # 500 while post-start hooks are still running
            return False


def component_healthy(port: int) -> bool:
    """/healthz of kube-controller-manager or kube-scheduler (self-signed, anonymous-allowed)."""
    context = ssl.create_default_context()
    # Their serving certificates are self-signed at start; only liveness is checked here.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=3) as resp:
            return resp.read() == b"ok"
    except urllib.error.HTTPError:
        return False


def fake_node(name: str, ip: str) -> dict[str, Any]:
    """A GPU node for kwok to play: no taints, so pods schedule without tolerations."""
    resources = {
        "cpu": "32",
        "memory": "256Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        "nvidia.com/gpu": "8",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1],
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/gpu": "",
                "nvidia.com/gpu.present": "true",
            },
        },
        # Node status may be set on create; kwok keeps this capacity when it initializes the node.
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
        },
    }


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    # The node lifecycle controller removes its not-ready taint shortly after Ready.
    return ready and not node.get("spec", {}).get("taints")


# --------------------------------------------------------------------------- processes


@dataclass
class Component:
    name: str
    pid: int
    popen: subprocess.Popen[bytes] | None = None  # None when adopted from a state dir

    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped yet) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def terminate(components: list[Component], timeout: float = 10) -> None:
    """Stop components one by one, in the order given: SIGTERM to the process group (each runs
    in its own session), SIGKILL after `timeout`.

    One at a time, because a component whose server (etcd under kube-apiserver) is already
    gone can spend its whole shutdown timeout retrying.
    """
    for comp in components:
        signal_group(comp.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while comp.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        if comp.running():
            signal_group(comp.pid, signal.SIGKILL)
        if comp.popen is not None:
            comp.popen.wait()
        else:
            while pid_alive(comp.pid):
                time.sleep(0.02)
        # Children left behind in the group (none expected) get the same fate.
        signal_group(comp.pid, signal.SIGKILL)


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# --------------------------------------------------------------------------- the control plane


@dataclass
class Ports:
    etcd_client: int = field(default_factory=free_port)
    etcd_peer: int = field(default_factory=free_port)
    apiserver: int = field(default_factory=free_port)
    controller_manager: int = field(default_factory=free_port)
    scheduler: int = field(default_factory=free_port)
    kwok: int = field(default_factory=free_port)


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok on loopback."""

    def __init__(
        self,
        bin_dir: str | os.PathLike[str],
        work_dir: str | os.PathLike[str],
        *,
        nodes: tuple[str, ...] = ("kwok-gpu-0", "kwok-gpu-1"),
        stages_file: Path = STAGES_FILE,
        timeout: float = 180,
        pod_gateway: str | None = None,
    ) -> None:
        """`pod_gateway`: serve the API on all addresses and advertise this one, for pods of a real
        node (hack/real-node.py) that reach the `kubernetes` Service through a DNAT to it."""
        self.bin_dir = Path(bin_dir).resolve()
        self.pod_gateway = pod_gateway
        self.work_dir = Path(work_dir).resolve()
        self.nodes = nodes
        self.stages_file = stages_file
        self.timeout = timeout
        self.pki = Pki(self.work_dir / "pki")
        self.log_dir = self.work_dir / "logs"
        self.kubeconfig = self.work_dir / "kubeconfig"
        self.ports = Ports()
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self.components: list[Component] = []
        self.startup_seconds: float | None = None
        # Called with each started component (the CLI records pids as they appear, so a failed
        # `up` can still be cleaned up by `down`).
        self.on_spawn: Callable[[Component], None] | None = None

    # ----- public API

    def start(self) -> None:
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(f"missing in {self.bin_dir}: {', '.join(missing)}; run hack/cluster-binaries.sh")
        begin = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - begin

    def stop(self) -> None:
        terminate(sorted(self.components, key=lambda c: -COMPONENT_ORDER.index(c.name)))
        self.components.clear()

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm/kopf against this control plane."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def api(self) -> Api:
        return Api(self.server, self.pki)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----- startup sequence

    def _start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.pki.generate()
        write_kubeconfig(self.kubeconfig, self.server, self.pki)
        api = self.api()
        self._spawn("etcd", self._etcd_args())
        self._spawn("kube-apiserver", self._apiserver_args())
        poll(api.readyz, self.timeout, "kube-apiserver /readyz", alive=self._check_alive)
        self._spawn("kube-controller-manager", self._controller_manager_args())
        self._spawn("kube-scheduler", self._scheduler_args())
        self._spawn("kwok", self._kwok_args())
        for index, name in enumerate(self.nodes):
            if not api.exists(f"/api/v1/nodes/{name}"):
                api.request("POST", "/api/v1/nodes", fake_node(name, f"{NODE_IP_PREFIX}{index + 1}"))
        self._wait_ready(api)

    def _wait_ready(self, api: Api) -> None:
        alive = self._check_alive
        poll(
            lambda: component_healthy(self.ports.controller_manager),
            self.timeout,
            "kube-controller-manager /healthz",
            alive=alive,
        )
        poll(
            lambda: component_healthy(self.ports.scheduler),
            self.timeout,
            "kube-scheduler /healthz",
            alive=alive,
        )

        def nodes_ready() -> bool:
            return all(node_ready(api.get(f"/api/v1/nodes/{n}")) for n in self.nodes)

        poll(nodes_ready, self.timeout, f"nodes {', '.join(self.nodes)} Ready", alive=alive)
        # Proves the serviceaccount controller runs: pods in fresh namespaces need it.
        poll(
            lambda: api.exists("/api/v1/namespaces/default/serviceaccounts/default"),
            self.timeout,
            "ServiceAccount default/default",
            alive=alive,
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.log_dir / f"{name}.log", "ab") as log:
            popen = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                # Own session: survives the CLI that started it, and stop() can signal the group.
                start_new_session=True,
            )
        component = Component(name, popen.pid, popen)
        self.components.append(component)
        if self.on_spawn is not None:
            self.on_spawn(component)

    def _check_alive(self) -> None:
        for comp in self.components:
            if not comp.running():
                raise ControlPlaneError(
                    f"{comp.name} exited during startup; see {self.log_dir / comp.name}.log:\n"
                    + tail(self.log_dir / f"{comp.name}.log")
                )

    # ----- command lines

    def _etcd_args(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        return [
            "--name=muralist",
            f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=muralist={peer}",
            # Test data is disposable: skipping fsync makes every write much faster.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        pki = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
            f"--secure-port={self.ports.apiserver}",
            f"--bind-address={'0.0.0.0' if self.pod_gateway else '127.0.0.1'}",
            f"--advertise-address={self.pod_gateway or '127.0.0.1'}",
            f"--cert-dir={self.work_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_crt}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_crt}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            # Loopback clients of a small test cluster need no request throttling.
            "--max-requests-inflight=1000",
            "--max-mutating-requests-inflight=500",
            # A real node's name does not resolve on the host: reach its kubelet (logs, exec) by IP.
            *(["--kubelet-preferred-address-types=InternalIP"] if self.pod_gateway else []),
        ]

    def _kube_client_args(self) -> list[str]:
        kubeconfig = str(self.kubeconfig)
        return [
            f"--kubeconfig={kubeconfig}",
            # Delegated authn/authz of their own /healthz endpoints go to the same API server.
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
        ]

    def _controller_manager_args(self) -> list[str]:
        pki = self.pki
        return [
            *self._kube_client_args(),
            f"--secure-port={self.ports.controller_manager}",
            f"--cert-dir={self.work_dir / 'controller-manager-certs'}",
            "--controllers=*",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_crt}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki.ca_crt}",
            f"--cluster-signing-key-file={pki.ca_key}",
            "--allocate-node-cidrs=false",
            # Fake nodes have no cloud and no routes to manage.
            "--configure-cloud-routes=false",
        ]

    def _scheduler_args(self) -> list[str]:
        return [
            *self._kube_client_args(),
            f"--secure-port={self.ports.scheduler}",
            f"--cert-dir={self.work_dir / 'scheduler-certs'}",
        ]

    def _kwok_args(self) -> list[str]:
        key, value = KWOK_NODE_ANNOTATION
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.stages_file}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            f"--server-address=127.0.0.1:{self.ports.kwok}",
            "--node-lease-duration-seconds=40",
            # kwok's default pod CIDR (10.0.0.0/24) overlaps the Service range.
            f"--cidr={POD_CIDR}",
        ]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- CLI (detached)


def state_file(state_dir: Path) -> Path:
    return state_dir / "state.json"


def load_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads(state_file(state_dir).read_text())
    except (OSError, ValueError):
        return None


def save_state(state_dir: Path, state: dict[str, Any]) -> None:
    tmp = state_file(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(state_file(state_dir))


def adopted_components(state: dict[str, Any]) -> list[Component]:
    """Components recorded in a state file that are still our processes (not a reused pid)."""
    bin_dir = state["bin_dir"]
    comps = []
    for name, pid in state.get("pids", {}).items():
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if exe == os.path.join(bin_dir, name):
            comps.append(Component(name, pid))
    return comps


def cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir.resolve()
    state = load_state(state_dir)
    if state and any(c.running() for c in adopted_components(state)):
        print(
            f"control plane already running (state in {state_dir}); `down` first to restart",
            file=sys.stderr,
        )
        return 0
    work_dir = state_dir / "cluster"
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    # For a real node (hack/real-node.py) kwok plays no node and pods must reach the API server.
    real_node = {"nodes": (), "pod_gateway": POD_GATEWAY} if args.real_node else {}
    cp = ControlPlane(args.bin_dir, work_dir, timeout=args.timeout, **real_node)  # type: ignore[arg-type]
    state = {
        "bin_dir": str(cp.bin_dir),
        "kubeconfig": str(cp.kubeconfig),
        "server": cp.server,
        "log_dir": str(cp.log_dir),
        "pids": {},
    }

    def record(comp: Component) -> None:
        state["pids"][comp.name] = comp.pid
        save_state(state_dir, state)

    cp.on_spawn = record
    save_state(state_dir, state)
    try:
        cp.start()
    except ControlPlaneError as exc:
        print(f"error: {exc}\nlogs: {cp.log_dir}", file=sys.stderr)
        return 1
    state["startup_seconds"] = round(cp.startup_seconds or 0, 2)
    save_state(state_dir, state)
    print(f"control plane ready in {cp.startup_seconds:.1f}s: {cp.server}", file=sys.stderr)
    print(f"logs: {cp.log_dir}", file=sys.stderr)
    print(f"KUBECONFIG={cp.kubeconfig}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir.resolve()
    state = load_state(state_dir)
    if state is None:
        print(f"nothing to stop in {state_dir}", file=sys.stderr)
        return 0
    comps = adopted_components(state)
    terminate(sorted(comps, key=lambda c: -COMPONENT_ORDER.index(c.name)))
    # Keep the logs for a post-mortem; everything else (etcd data, keys) goes.
    cluster_dir = state_dir / "cluster"
    for path in cluster_dir.iterdir() if cluster_dir.is_dir() else ():
        if path.is_dir() and path.name != "logs":
            shutil.rmtree(path)
        elif path.is_file():
            path.unlink()
    state_file(state_dir).unlink(missing_ok=True)
    print(f"stopped {len(comps)} processes; logs kept in {state['log_dir']}", file=sys.stderr)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    state = load_state(args.state_dir.resolve())
    if state is None:
        print(f"no control plane in {args.state_dir}; run `up` first", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={state['kubeconfig']}")
    print(f"export PATH={state['bin_dir']}:$PATH")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("up", cmd_up), ("down", cmd_down), ("env", cmd_env)):
        p = sub.add_parser(name)
        p.add_argument("--state-dir", type=Path, required=True)
        p.set_defaults(func=func)
        if name == "up":
            p.add_argument(
                "--bin-dir",
                type=Path,
                default=None,
                help="binaries (default: $MURALIST_K8S_BIN or the build cache)",
            )
            p.add_argument(
                "--timeout",
                type=float,
                default=180,
                help="seconds to wait for each readiness check",
            )
            p.add_argument(
                "--real-node",
                action="store_true",
                help="no kwok nodes; serve the API to the pods of hack/real-node.py",
            )
    args = parser.parse_args(argv)
    if getattr(args, "bin_dir", "unset") is None:
        args.bin_dir = default_bin_dir()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
