#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback for tests and local development, run by kwokctl.

kwokctl (sigs.k8s.io/kwok's cluster tool, `binary` runtime) makes the certificates and the admin
kubeconfig and starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
(which plays the nodes and the kubelets, with the stages in hack/kwok-stages.yaml) as detached
processes on free loopback ports, from the binaries hack/cluster-binaries.sh builds: nothing is
downloaded. This module gives kwokctl the flags the tests rely on (`kwokctl_config`), creates
the fake GPU nodes, and waits until the cluster is usable: the controllers and the scheduler
serve, the nodes are Ready, the `default` ServiceAccount exists. Standard library only, so it
works before any virtualenv exists.

As a module:

    cp = ControlPlane(bin_dir, work_dir)
    cp.start()                 # returns once the API serves, nodes are Ready, etc.
    subprocess.run(["kubectl", "get", "nodes"], env={**os.environ, **cp.env()})
    cp.stop()

As a command (detached processes, state in a directory):

    python3 hack/controlplane.py up   --state-dir DIR [--bin-dir BIN]
    python3 hack/controlplane.py env  --state-dir DIR     # prints export lines
    python3 hack/controlplane.py down --state-dir DIR

Layout of a work dir W (kwokctl's KWOK_WORKDIR): W/clusters/muralist/ holds kubeconfig.yaml,
pki/ (one CA; one admin certificate that also serves the API and signs service-account tokens),
logs/<component>.log (and kwokctl.log), pids/, etcd/ and kwok.yaml (kwokctl's record of the
cluster: components, their command lines, the stages).
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
    "kwokctl",
)
CLUSTER_NAME = "muralist"
# kwokctl's component names; the API server and etcd must live for the others to start.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")
SERVER_COMPONENTS = COMPONENTS[:2]

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"
NODE_IP_PREFIX = "10.250.0."  # fake node addresses: .1, .2, ...
SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
# hack/real-node.py's pod bridge gateway: where pods reach the API server (and CoreDNS).
POD_GATEWAY = "10.88.0.1"
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


def cluster_dir(work_dir: Path) -> Path:
    """kwokctl's directory of the cluster in a work dir (kubeconfig.yaml, pki/, logs/, pids/)."""
    return Path(work_dir).resolve() / "clusters" / CLUSTER_NAME


def kubeconfig_path(work_dir: Path) -> Path:
    return cluster_dir(work_dir) / "kubeconfig.yaml"


def kubeconfig_server(kubeconfig: Path) -> str:
    """The API server's URL in a kubeconfig kwokctl wrote (one cluster; no YAML parser needed)."""
    match = re.search(r"^\s*server:\s*(\S+)\s*$", kubeconfig.read_text(), re.MULTILINE)
    if match is None:
        raise ControlPlaneError(f"no server in {kubeconfig}")
    return match.group(1)


# --------------------------------------------------------------------------- small utilities


def free_port() -> int:
    # The port is released before the component binds it; on loopback with ephemeral ports
    # handed out in sequence a collision is very unlikely, and start() fails loudly if it happens.
    # (kwokctl's own choice counts down from 32767 in every work dir: concurrent sessions collide.)
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


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- API access


class Api:
    """Just enough of a Kubernetes REST client for bootstrapping (GET/POST JSON)."""

    def __init__(self, server: str, pki_dir: Path) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
        self.context.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))

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


# --------------------------------------------------------------------------- kwokctl's configuration


@dataclass
class Ports:
    etcd_client: int = field(default_factory=free_port)
    etcd_peer: int = field(default_factory=free_port)
    apiserver: int = field(default_factory=free_port)
    controller_manager: int = field(default_factory=free_port)
    scheduler: int = field(default_factory=free_port)
    kwok: int = field(default_factory=free_port)


def _args(component: str, *flags: str, override: tuple[str, ...] = ()) -> dict[str, Any]:
    """A componentsPatches entry: `flags` appended ("key=value"), `override` replacing kwokctl's."""
    extra = [{"key": k, "value": v} for k, _, v in (f.partition("=") for f in flags)]
    extra += [{"key": k, "value": v, "override": True} for k, _, v in (f.partition("=") for f in override)]
    return {"name": component, "extraArgs": extra}


def kwokctl_config(bin_dir: Path, pki_dir: Path, ports: Ports, pod_gateway: str | None) -> dict[str, Any]:
    """The KwokctlConfiguration of one cluster: local binaries, fixed ports, and the flags the
    tests rely on beyond kwokctl's own (service-account issuer and keys, RBAC, admission and
    the certificates are kwokctl's defaults)."""
    apiserver = [
        f"service-cluster-ip-range={SERVICE_CIDR}",
        f"advertise-address={pod_gateway or '127.0.0.1'}",
        "profiling=false",
        # Loopback clients of a small test cluster need no request throttling.
        "max-requests-inflight=1000",
        "max-mutating-requests-inflight=500",
    ]
    apiserver_override: tuple[str, ...] = ()
    if pod_gateway:
        # Pods of a real node reach the API server through a DNAT to the bridge's gateway; only
        # the API server listens beyond loopback. A real node's name does not resolve on the
        # host: reach its kubelet (logs, exec) by IP.
        apiserver.append("kubelet-preferred-address-types=InternalIP")
        apiserver_override = ("bind-address=0.0.0.0",)
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "bindAddress": "127.0.0.1",
            "etcdBinary": str(bin_dir / "etcd"),
            "kubeApiserverBinary": str(bin_dir / "kube-apiserver"),
            "kubeControllerManagerBinary": str(bin_dir / "kube-controller-manager"),
            "kubeSchedulerBinary": str(bin_dir / "kube-scheduler"),
            "kwokControllerBinary": str(bin_dir / "kwok"),
            "kubectlBinary": str(bin_dir / "kubectl"),
            "etcdPort": ports.etcd_client,
            "etcdPeerPort": ports.etcd_peer,
            "kubeApiserverPort": ports.apiserver,
            "kubeControllerManagerPort": ports.controller_manager,
            "kubeSchedulerPort": ports.scheduler,
            "kwokControllerPort": ports.kwok,
            # Pods reach the API server as the `kubernetes` Service, by its address and names
            # (the names are in kwokctl's certificate already) and, on a real node, at the gateway.
            "kubeApiserverCertSANs": [SERVICE_IP, *([pod_gateway] if pod_gateway else [])],
            "heartbeatFactor": 1,
            "nodeLeaseDurationSeconds": 40,
        },
        "componentsPatches": [
            # Test data is disposable: skipping fsync makes every write much faster.
            _args("etcd", "unsafe-no-fsync=true", "log-level=warn"),
            _args("kube-apiserver", *apiserver, override=apiserver_override),
            _args(
                "kube-controller-manager",
                "use-service-account-credentials=true",
                f"cluster-signing-cert-file={pki_dir / 'ca.crt'}",
                f"cluster-signing-key-file={pki_dir / 'ca.key'}",
                "leader-elect=false",
                # Fake nodes have no cloud and no routes to manage.
                "configure-cloud-routes=false",
            ),
            _args("kube-scheduler", "leader-elect=false"),
            _args(
                "kwok-controller",
                f"manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION[0]}={KWOK_NODE_ANNOTATION[1]}",
                # kwok's default pod CIDR (10.0.0.0/24) overlaps the Service range.
                f"cidr={POD_CIDR}",
                # Only the annotated (fake) nodes: a real node's kubelet reports for itself.
                override=("manage-all-nodes=false",),
            ),
        ],
    }


# --------------------------------------------------------------------------- the control plane


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, by kwokctl."""

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
        self.cluster_dir = cluster_dir(self.work_dir)
        self.pki_dir = self.cluster_dir / "pki"
        self.log_dir = self.cluster_dir / "logs"
        self.kubeconfig = kubeconfig_path(self.work_dir)
        self.ports = Ports()
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self.startup_seconds: float | None = None

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
        """`kwokctl stop cluster` (SIGKILL to each component), then wait until they are gone:
        kwokctl cannot wait for processes that are not its children."""
        pids = self.pids()
        if pids:
            self._kwokctl("stop", "cluster", timeout=60, check=False)
        deadline = time.monotonic() + 30
        for pid in pids.values():
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if pid_alive(pid):  # kwokctl failed: do its job
                os.kill(pid, signal.SIGKILL)

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm/kopf against this control plane."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def api(self) -> Api:
        return Api(self.server, self.pki_dir)

    def pids(self) -> dict[str, int]:
        """The components kwokctl started, by name (from its pid files)."""
        pids = {}
        for path in (self.cluster_dir / "pids").glob("*.pid"):
            try:
                pids[path.stem] = int(path.read_text())
            except (OSError, ValueError):
                continue
        return pids

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----- startup sequence

    def _kwokctl(self, *args: str, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KWOK_WORKDIR": str(self.work_dir),
            # kwokctl runs the first kubectl on PATH; ours is the one built for this version.
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        argv = [str(self.bin_dir / "kwokctl"), "--name", CLUSTER_NAME, *args]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / "kwokctl.log", "a") as log:
            log.write(f"$ kwokctl {' '.join(args)}\n{proc.stdout}{proc.stderr}")
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"kwokctl {' '.join(args)} failed ({proc.returncode}); see {self.log_dir}/kwokctl.log:\n"
                + "\n".join(proc.stderr.splitlines()[-10:])
            )
        return proc

    def _start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "kwokctl.yaml"
        stages = self.stages_file.read_text()
        # kwokctl hands the Stages of its --config files to kwok, in place of its default ones.
        settings = kwokctl_config(self.bin_dir, self.pki_dir, self.ports, self.pod_gateway)
        config.write_text(json.dumps(settings, indent=2) + "\n---\n" + stages)
        # Returns once `kubectl get --raw /version` answers (or after 2 minutes, with a warning).
        # --kubeconfig "": leave ~/.kube/config alone.
        self._kwokctl("create", "cluster", f"--config={config}", "--kubeconfig=", timeout=self.timeout + 60)
        api = self.api()
        poll(api.readyz, self.timeout, "kube-apiserver /readyz", alive=lambda: self._check_alive(SERVER_COMPONENTS))
        # kwokctl starts every component at once; kube-controller-manager and kwok give up
        # when the API server is not healthy within about 10 s, which a busy machine can take:
        # start again whichever gave up (`start cluster` skips those running).
        if any(not pid_alive(pid) for pid in self.pids().values()):
            self._kwokctl("start", "cluster", timeout=self.timeout)
        for index, name in enumerate(self.nodes):
            if not api.exists(f"/api/v1/nodes/{name}"):
                api.request("POST", "/api/v1/nodes", fake_node(name, f"{NODE_IP_PREFIX}{index + 1}"))
        self._wait_ready(api)

    def _wait_ready(self, api: Api) -> None:
        def alive() -> None:
            self._check_alive(COMPONENTS)

        poll(
            lambda: component_healthy(self.ports.controller_manager),
            self.timeout,
            "kube-controller-manager /healthz",
            alive=alive,
        )
        poll(lambda: component_healthy(self.ports.scheduler), self.timeout, "kube-scheduler /healthz", alive=alive)

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

    def _check_alive(self, names: tuple[str, ...]) -> None:
        pids = self.pids()
        for name in names:
            if name in pids and not pid_alive(pids[name]):
                log = self.log_dir / f"{name}.log"
                raise ControlPlaneError(f"{name} exited during startup; see {log}:\n{tail(log)}")


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


def _detached(state_dir: Path, state: dict[str, Any]) -> ControlPlane:
    """The control plane a state dir records (for `down`: its pids and kwokctl)."""
    return ControlPlane(state["bin_dir"], state_dir / "cluster")


def cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir.resolve()
    state = load_state(state_dir)
    if state and any(pid_alive(pid) for pid in _detached(state_dir, state).pids().values()):
        print(
            f"control plane already running (state in {state_dir}); `down` first to restart",
            file=sys.stderr,
        )
        return 0
    work_dir = state_dir / "cluster"
    shutil.rmtree(work_dir, ignore_errors=True)
    # For a real node (hack/real-node.py) kwok plays no node and pods must reach the API server.
    real_node = {"nodes": (), "pod_gateway": POD_GATEWAY} if args.real_node else {}
    cp = ControlPlane(args.bin_dir, work_dir, timeout=args.timeout, **real_node)  # type: ignore[arg-type]
    state = {"bin_dir": str(cp.bin_dir), "kubeconfig": str(cp.kubeconfig), "log_dir": str(cp.log_dir)}
    state_dir.mkdir(parents=True, exist_ok=True)
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
    cp = _detached(state_dir, state)
    count = sum(pid_alive(pid) for pid in cp.pids().values())
    cp.stop()
    # Keep the logs for a post-mortem; everything else (etcd data, keys) goes.
    for path in cp.cluster_dir.iterdir() if cp.cluster_dir.is_dir() else ():
        if path.name == "logs":
            continue
        if path.is_dir():  # bin/ holds links to the binaries: rmtree removes the links only
            shutil.rmtree(path)
        else:
            path.unlink()
    (cp.work_dir / "kwokctl.yaml").unlink(missing_ok=True)
    state_file(state_dir).unlink(missing_ok=True)
    print(f"stopped {count} processes; logs kept in {state['log_dir']}", file=sys.stderr)
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
