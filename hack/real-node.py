#!/usr/bin/env python3
"""A real single node for Muralist's control plane, the way hack/local-up-cluster.sh runs one.

containerd (Debian's package, its own socket and state in WORK), runc, the bridge CNI plugins
(Debian's containernetworking-plugins), a locally built pause image, CoreDNS on the bridge
gateway and kubelet registered as node `muralist-node`. Pods reach the API server through the
`kubernetes` Service address (a DNAT rule standing in for kube-proxy). Root only; standard
library only. Nothing is pulled: images come from the local Docker engine into an image store
kept between runs (~/.cache/muralist/containerd), so an unchanged image is imported once and a
changed one costs the layers that changed (hack/docker_layers.py; `docker save | ctr import` where
Docker's storage cannot be read).

    cp = cpl.ControlPlane(bin_dir, dir, nodes=(), pod_gateway=cpl.POD_GATEWAY); cp.start()
    node = RealNode(bin_dir, work_dir, cp.kubeconfig)   # kubelet and CoreDNS use the admin kubeconfig
    node.start()                                 # returns once the node is Ready
    node.load_docker_image("muralist-runtime:dev")
    node.stop()                                  # pods deleted, processes stopped, host cleaned

As a command (hack/dev-cluster.sh up --real-node runs these after `controlplane.py up --real-node`):

    python3 hack/real-node.py up   --state-dir DIR   # node in DIR/node, for the control plane in DIR/cluster
    python3 hack/real-node.py load --state-dir DIR IMAGE...
    python3 hack/real-node.py down --state-dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

HACK_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HACK_DIR))
import controlplane as cpl  # noqa: E402
import docker_layers  # noqa: E402

NODE_NAME = "muralist-node"
NODE_LABEL = ("muralist.dev/real-node", "true")
BRIDGE = "mural0"
POD_SUBNET = "10.88.0.0/16"
GATEWAY = cpl.POD_GATEWAY
# containerd's root (content and snapshots): kept between runs so an image is imported once.
IMAGE_STORE = Path(os.environ.get("MURALIST_CONTAINERD_ROOT", Path.home() / ".cache/muralist/containerd"))
PAUSE_IMAGE = "muralist-pause:local"
# Refs that hold an image's previous version while a new one is imported (see load_docker_image).
KEEP_PREFIX = "muralist.local/keep/"
CNI_BIN_DIR = "/usr/lib/cni"
RULE_COMMENT = ("-m", "comment", "--comment", "muralist real node")
FORWARD_RULE = ("FORWARD", "-i", BRIDGE, "-o", BRIDGE, *RULE_COMMENT, "-j", "ACCEPT")
PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; }
int main(void) {
    signal(SIGINT, quit); signal(SIGTERM, quit); signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


def log(msg: str) -> None:
    print(f"[real-node] {msg}", file=sys.stderr, flush=True)


def sh(*args: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}{proc.stdout[-1000:]}")
    return proc


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def delete_rules(table: str, chain: str) -> None:
    """Every rule of ours (by comment) in one chain."""
    for line in sh("iptables", "-t", table, "-S", chain, check=False).stdout.splitlines():
        if RULE_COMMENT[-1] in line and line.startswith("-A "):
            sh("sh", "-c", f"iptables -t {table} -D {line[3:]}", check=False)


# --------------------------------------------------------------------------- pause image


def docker_archive(binary: bytes, name: str, entrypoint: str) -> bytes:
    """A `docker save`-format tar holding one layer with one static binary."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as layer:
        info = tarfile.TarInfo(entrypoint.lstrip("/"))
        info.size, info.mode = len(binary), 0o755
        layer.addfile(info, io.BytesIO(binary))
    layer_bytes = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [entrypoint]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "hack/real-node.py"}],
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": ["layer/layer.tar"]}]).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, data in ((config_name, config), ("layer/layer.tar", layer_bytes), ("manifest.json", manifest)):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def build_pause(work: Path) -> Path:
    src, binary, tar = work / "pause.c", work / "pause", work / "pause.tar"
    src.write_text(PAUSE_C)
    sh("gcc", "-static", "-Os", "-s", "-o", str(binary), str(src))
    tar.write_bytes(docker_archive(binary.read_bytes(), PAUSE_IMAGE, "/pause"))
    return tar


# --------------------------------------------------------------------------- the node


class RealNode:
    def __init__(
        self, bin_dir: Path, work_dir: Path, kubeconfig: Path, timeout: float = 120, image_store: Path = IMAGE_STORE
    ) -> None:
        self.bin_dir = Path(bin_dir)
        self.work = Path(work_dir).resolve()
        self.kubeconfig = Path(kubeconfig)
        self.timeout = timeout
        self.image_store = Path(image_store).resolve()
        self.sock = self.work / "containerd.sock"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # containerd (like `ip netns add`) bind-mounts /run/netns onto itself: undo it if it was not so.
        self.netns_was_mounted = os.path.ismount("/run/netns")
        self.logs = self.work / "logs"
        self.timings: dict[str, float] = {}

    # ----- helpers
    def ctr(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return sh("ctr", "--address", str(self.sock), "-n", "k8s.io", *args, **kw)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return sh(str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args, check=check, timeout=timeout)

    def _spawn(self, name: str, args: list[str]) -> None:
        out = (self.logs / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        (self.work / f"{name}.pid").write_text(str(self.procs[name].pid))

    def _alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited ({proc.returncode}); log {self.logs / name}.log:\n"
                    + cpl.tail(self.logs / f"{name}.log")
                )

    def _timed(self, step: str, begin: float) -> None:
        self.timings[step] = round(time.monotonic() - begin, 1)
        log(f"{step}: {self.timings[step]} s")

    # ----- start
    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        if self._mounts():  # never delete through a pod's volume mount
            raise RuntimeError(f"mounts left under {self.work} by an earlier run: `down` it first")
        for stale in ("cni", "containerd", "kubelet"):  # of an earlier run in the same work dir
            shutil.rmtree(self.work / stale, ignore_errors=True)
        for sub in ("logs", "cni/net.d", "cni/ipam", "containerd/state", "kubelet"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        self.image_store.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        pause_tar = build_pause(self.work)
        self._timed("pause image", t)

        # The bridge is made here (not by the CNI plugin) so CoreDNS can bind the gateway first.
        if sh("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "replace", f"{GATEWAY}/16", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        # br_netfilter sends bridged pod-to-pod traffic through FORWARD, whose policy dockerd
        # sets to DROP: accept what stays on our bridge (removed again in stop()).
        if sh("iptables", "-C", *FORWARD_RULE, check=False).returncode != 0:
            sh("iptables", "-I", *FORWARD_RULE)
        # No kube-proxy: the one Service pods need by address, `kubernetes`, is DNATed to the API
        # server (which serves on all addresses, see cpl.ControlPlane's pod_gateway).
        if sh("iptables", "-t", "nat", "-C", *self._api_rule(), check=False).returncode != 0:
            sh("iptables", "-t", "nat", "-I", *self._api_rule())
        self._write_cni()

        t = time.monotonic()
        self._write_containerd_config()
        self._spawn("containerd", ["containerd", "--config", str(self.work / "containerd.toml")])
        cpl.poll(
            lambda: self.ctr("version", check=False).returncode == 0, self.timeout, "containerd", alive=self._alive
        )
        self._timed("containerd up", t)
        self._drop_leftovers_of_interrupted_loads()
        t = time.monotonic()
        self.import_image(pause_tar)
        self._timed("import pause", t)

        t = time.monotonic()
        (self.work / "Corefile").write_text(self._corefile())
        self._spawn("coredns", [str(self.bin_dir / "coredns"), "-conf", str(self.work / "Corefile")])
        cpl.poll(self._dig_ok, self.timeout, "CoreDNS", alive=self._alive)
        self._timed("coredns up", t)

        t = time.monotonic()
        self._write_kubelet_config()
        self._spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={self.work / 'kubelet.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--root-dir={self.work / 'kubelet'}",
                f"--cert-dir={self.work / 'kubelet/pki'}",
                f"--node-labels={NODE_LABEL[0]}={NODE_LABEL[1]}",
                "--v=2",
            ],
        )

        def ready() -> bool:
            proc = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            return proc.returncode == 0 and cpl.node_ready(json.loads(proc.stdout))

        cpl.poll(ready, self.timeout, f"node {NODE_NAME} Ready", interval=1, alive=self._alive)
        self._timed("kubelet up, node Ready", t)

    def _api_rule(self) -> tuple[str, ...]:
        port = cpl.kubeconfig_server(self.kubeconfig).rsplit(":", 1)[1]
        return (
            "PREROUTING", "-s", POD_SUBNET, "-d", cpl.SERVICE_IP, "-p", "tcp", "--dport", "443", *RULE_COMMENT,
            "-j", "DNAT", "--to-destination", f"{GATEWAY}:{port}",
        )  # fmt: skip

    def _dig_ok(self) -> bool:
        import socket

        # A UDP DNS query for kubernetes.default.svc.cluster.local A, answered => CoreDNS serves.
        q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
        for part in ["kubernetes", "default", "svc", "cluster", "local"]:
            q += bytes([len(part)]) + part.encode()
        q += b"\x00\x00\x01\x00\x01"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1)
            s.sendto(q, (GATEWAY, 53))
            data = s.recv(512)
        return data[:2] == b"\x12\x34" and (data[3] & 0x0F) == 0 and data[7] > 0

    def import_image(self, tar: Path) -> None:
        """A `docker save`-format archive into containerd's k8s.io namespace, unpacked."""
        with open(tar, "rb") as f:
            self._import(f)

    @property
    def _ctr_import(self) -> list[str]:
        return ["ctr", "--address", str(self.sock), "-n", "k8s.io", "images", "import", "-"]

    def _import(self, stream: Any) -> None:
        proc = subprocess.run(
            self._ctr_import,
            stdin=stream,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ctr images import: {proc.stderr[-3000:]}")

    def load_docker_image(self, name: str, docker: str = "docker") -> bool:
        """The Docker image NAME into the image store, unless this very image (by Docker image ID)
        is there already; True when it was imported."""
        image_id = sh(docker, "image", "inspect", "--format", "{{.Id}}", name).stdout.strip()
        stamp = self.image_store / "muralist-imported" / name.replace("/", "_").replace(":", "_")
        ref = name if "/" in name.split(":")[0] else f"docker.io/library/{name}"
        present = self.ctr("images", "ls", "-q", f"name=={ref}", check=False).stdout.split()
        previous = stamp.read_text() if stamp.is_file() else None
        if present and previous == image_id:
            log(f"{name}: {image_id[:19]} already imported")
            return False
        t = time.monotonic()
        # The import moves `ref` to the new image before unpacking it; from then on the old
        # version's snapshots, which the unpack reuses for the layers both share, belong to no
        # image, and a garbage collection between the unpacker's check of a shared layer and its
        # use as a parent fails the import ("parent snapshot ... does not exist"). A second ref
        # keeps the old version whole until the new one is unpacked.
        keep = KEEP_PREFIX + ref
        if present:
            self.ctr("images", "tag", "--force", ref, keep)
        try:
            self._import_from_docker(docker, name, ref)
        finally:
            if present:
                self.ctr("images", "rm", keep, check=False)
        if previous and previous != image_id:
            # Also drop the reference containerd's CRI plugin adds by image ID, or old GBs pile up.
            self.ctr("images", "rm", previous, check=False)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(image_id)
        self._timed(f"import {name}", t)
        return True

    def _import_from_docker(self, docker: str, name: str, ref: str) -> None:
        """The layers the store lacks, read from the Docker engine's storage (seconds for a
        changed code layer); the whole image through `docker save` where that storage cannot be
        read here or a layer does not replay to its digest."""
        image = docker_layers.LocalImage.inspect(name, docker)
        if image is not None:
            present = set(self.ctr("content", "ls", "-q").stdout.split())
            try:
                sent = self._import_streamed(lambda stdin: image.write_oci(stdin, ref, present))
            except (RuntimeError, OSError) as exc:
                log(f"{name}: reading its layers from Docker's storage failed ({exc}); through docker save then")
            else:
                log(f"{name}: {sent} of {len(image.layers)} layers sent, read from Docker's storage")
                return
        save = subprocess.Popen([docker, "save", name], stdout=subprocess.PIPE)
        try:
            self._import(save.stdout)
        finally:
            if save.stdout:
                save.stdout.close()
            if save.wait() != 0:
                raise RuntimeError(f"docker save {name} failed ({save.returncode})")
        log(f"{name}: every layer sent, through docker save")

    def _import_streamed(self, write: Callable[[IO[bytes]], int]) -> int:
        """`ctr images import -` fed by `write`; what `write` returned, once the image is unpacked."""
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(self._ctr_import, stdin=subprocess.PIPE, stdout=err, stderr=err)
            assert proc.stdin is not None
            try:
                result = write(proc.stdin)
                proc.stdin.close()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            if proc.wait() != 0:
                err.seek(0)
                raise RuntimeError(f"ctr images import: {err.read()[-3000:].decode(errors='replace')}")
        return result

    def _drop_leftovers_of_interrupted_loads(self) -> None:
        """A `ctr import` killed part-way leaves its lease, which pins everything it wrote (GBs)
        for a day, and a `load` killed part-way its keep ref. Nothing else uses the store yet."""
        keeps = [r for r in self.ctr("images", "ls", "-q").stdout.split() if r.startswith(KEEP_PREFIX)]
        if keeps:
            self.ctr("images", "rm", *keeps)
        leases = self.ctr("leases", "ls", "-q").stdout.split()
        if leases:
            # --sync: what they pinned, half-unpacked layers included, is gone before any import
            # could take one of those layers for a parent while a collection removes it.
            self.ctr("leases", "rm", "--sync", *leases)
        if leases or keeps:
            log(f"dropped {len(leases)} lease(s) and {len(keeps)} ref(s) left by an interrupted load")

    # ----- configuration
    def _write_cni(self) -> None:
        conf = {
            "cniVersion": "1.0.0",
            "name": "muralist",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.work / "cni/ipam"),
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (self.work / "cni/net.d/10-muralist.conflist").write_text(json.dumps(conf, indent=2))
        (self.work / "cni/net.d/99-loopback.conf").write_text(
            json.dumps({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"})
        )

    def _write_containerd_config(self) -> None:
        w = self.work
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (w / "containerd.toml").write_text(f"""version = 2
root = "{self.image_store}"
state = "{w}/containerd/state"
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[debug]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_cdi = false
  # This machine refuses lowering oom_score_adj (runc: "failed to update /proc/self/oom_score_adj:
  # Permission denied"); clamp to containerd's own value.
  restrict_oom_score_adj = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{os.environ.get("MURALIST_RUNC", "runc")}"
[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{w}/cni/net.d"
""")

    def _corefile(self) -> str:
        return f"""cluster.local:53 in-addr.arpa:53 {{
    bind {GATEWAY}
    errors
    kubernetes cluster.local in-addr.arpa {{
        kubeconfig {self.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa
        ttl 0
    }}
}}
.:53 {{
    bind {GATEWAY}
    errors
    forward . /etc/resolv.conf
}}
"""

    def _write_kubelet_config(self) -> None:
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "readOnlyPort": 0,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "clusterDNS": [GATEWAY],
            "clusterDomain": "cluster.local",
            "resolvConf": "/etc/resolv.conf",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # Absolute floors, not percentages: on a shared 252 GB disk 1 % is 2.5 GB, which a
            # runtime image's import (docker's copy, the store's, the unpacked snapshots) crossed
            # for a moment, and the kubelet reclaimed by deleting every unused image, the
            # sandbox's pause image too (containerd 1.6 cannot pin it): no pod started after that.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "100Mi", "imagefs.available": "100Mi"},
            "serializeImagePulls": False,
            "registerNode": True,
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
        }
        (self.work / "kubelet.yaml").write_text(json.dumps(cfg, indent=2))

    # ----- stop
    def stop(self, drain_timeout: float = 60) -> None:
        if self._running("kubelet"):
            # Pods deleted while kubelet runs get a proper StopPodSandbox (CNI DEL, netns unmount).
            self.kubectl(
                "delete",
                "pods",
                "--all-namespaces",
                "--all",
                "--grace-period=1",
                f"--field-selector=spec.nodeName={NODE_NAME}",
                f"--timeout={drain_timeout:.0f}s",
                check=False,
                timeout=drain_timeout + 10,
            )
            self.kubectl("delete", "node", NODE_NAME, "--wait=false", check=False)
        self._stop_proc("kubelet")
        if self._running("containerd"):
            # Whatever is left: kill tasks, remove containers and the sandboxes' network.
            for cid in self.ctr("containers", "list", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
            time.sleep(1)
            for cid in self.ctr("containers", "list", "-q", check=False).stdout.split():
                self.ctr("tasks", "delete", "-f", cid, check=False)
                self.ctr("containers", "delete", cid, check=False)
        self._stop_proc("coredns")
        self._stop_proc("containerd")
        self._kill_shims()
        self._cleanup_host()

    def _running(self, name: str) -> bool:
        """Ours, started here or (for `down`) by an earlier `up` that left its pid file."""
        if name in self.procs:
            return self.procs[name].poll() is None
        pidfile = self.work / f"{name}.pid"
        return pidfile.is_file() and cpl.pid_alive(int(pidfile.read_text()))

    def _stop_proc(self, name: str, timeout: float = 15) -> None:
        """SIGTERM to its process group (each runs in its own session), SIGKILL after `timeout`;
        started here or (for `down`) by an earlier `up` that left its pid file."""
        pidfile = self.work / f"{name}.pid"
        proc = self.procs.pop(name, None)
        pid = proc.pid if proc is not None else int(pidfile.read_text()) if pidfile.is_file() else None
        if pid is not None:
            signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while cpl.pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            # Also whatever it left in its group.
            signal_group(pid, signal.SIGKILL)
            while cpl.pid_alive(pid):
                time.sleep(0.02)
            if proc is not None:
                proc.wait()
        pidfile.unlink(missing_ok=True)

    def _kill_shims(self) -> None:
        # containerd-shim-runc-v2 outlives containerd; ours name our socket on their command line.
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and str(self.sock).encode() in cmd:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def _mounts(self) -> list[str]:
        points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        return [m for m in points if m.startswith((f"{self.work}/", "/run/netns/cni-"))]

    def _cleanup_host(self) -> None:
        # Mounts under the work dir (overlay rootfs, netns, tmpfs volumes, shm), deepest first.
        for _ in range(3):
            mounts = self._mounts()
            if not mounts:
                break
            for m in sorted(mounts, key=len, reverse=True):
                sh("umount", "-l", m, check=False)
        for path in Path("/run/netns").glob("cni-*") if Path("/run/netns").exists() else []:
            path.unlink(missing_ok=True)
        if not self.netns_was_mounted and os.path.ismount("/run/netns") and not any(Path("/run/netns").iterdir()):
            sh("umount", "/run/netns", check=False)
        # veth peers go with their netns; the bridge is ours.
        sh("ip", "link", "delete", BRIDGE, check=False)
        delete_rules("filter", "FORWARD")
        delete_rules("nat", "PREROUTING")
        # kubelet's cgroups (cgroupfs driver): kubepods trees, deepest first.
        for root in Path("/sys/fs/cgroup").iterdir():
            tree = root / "kubepods"
            if tree.is_dir():
                for d in sorted((p for p in tree.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        d.rmdir()
                with contextlib.suppress(OSError):
                    tree.rmdir()


# --------------------------------------------------------------------------- CLI


def _node(state_dir: Path) -> RealNode:
    return RealNode(cpl.default_bin_dir(), state_dir / "node", cpl.kubeconfig_path(state_dir / "cluster"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["up", "load", "down"])
    p.add_argument("images", nargs="*", help="load: local Docker images to import")
    p.add_argument("--state-dir", type=Path, required=True, help="hack/controlplane.py's state dir")
    args = p.parse_intermixed_args(argv)
    state_dir = args.state_dir.resolve()
    node = _node(state_dir)
    if args.action == "up":
        if not node.kubeconfig.is_file():
            p.error(f"no control plane in {state_dir}: hack/controlplane.py up --real-node first")
        node.start()
        log(f"node {NODE_NAME} Ready; logs in {node.logs}")
    elif args.action == "load":
        for image in args.images:
            node.load_docker_image(image)
    else:
        node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
