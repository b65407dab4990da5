"""pytest plugin: Kueue's real manager against the test control plane (tests/cluster_plugin.py).

Registered from tests/conftest.py. The `kueue` fixture (session) installs Kueue's CRDs and runs
the `kueue` manager that hack/cluster-binaries.sh builds next to the control plane's binaries
(the CRDs, copied from the same module version at build time, in bin/kueue-crds/). Without them
the tests that use it are skipped, unless MURALIST_REQUIRE_CLUSTER=1 (CI), where that fails.

How it runs outside a cluster:
- No webhook configurations are registered. The API server cannot reach a Service here (no
  kube-proxy), and a webhook by `url: https://127.0.0.1:PORT` needs a serving certificate for that
  address: Kueue either makes its own (internal certificate management, for the Service's DNS
  name only) or, with that off, v0.17 also insists on a metrics certificate at the fixed path
  /etc/kueue/metrics/certs, which a test must not write. So Kueue runs without its admission
  webhooks: the operator creates queued Jobs suspended and labelled itself, which is what
  Kueue's Job webhook would add; Kueue's controllers (Job -> Workload, admission, preemption)
  are the same code either way.
- Internal certificate management stays on (it needs no files from outside). Its rotator writes
  the certificate into a Secret and waits until it is in `webhook.certDir`, where a pod would have
  the Secret mounted: the fixture plays the kubelet and copies it there. The rotator also injects
  its CA into the conversion webhooks of the CRDs Kueue converts; they get the conversion stanza
  of Kueue's own manifests (service kueue-webhook-service), never called: every client here,
  Kueue included, reads and writes the stored version, v1beta2.
- Leader election off; every port on loopback and free; metrics and the visibility API off.

The manager's log is written to the control plane's log directory (kueue.log), so the control
plane fixture keeps it with the other components' logs when a test of the session fails.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import summary_plugin
from tests.cluster_plugin import _unavailable, load_controlplane
from tests.kube_helpers import wait_for

KUEUE_NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
# The CRDs whose conversion webhook Kueue's certificate rotator injects its CA into (it waits
# for all of them before the manager starts).
CONVERTED = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
SUMMARY_SECTION = "setup step timings (kueue)"


@dataclass
class Kueue:
    process: subprocess.Popen[bytes]
    log: Path
    health_port: int

    def alive(self) -> None:
        if self.process.poll() is not None:
            tail = load_controlplane().tail(self.log)
            raise AssertionError(f"kueue exited ({self.process.returncode}); see {self.log}:\n{tail}")


def kueue_crds(crd_dir: Path) -> list[dict[str, Any]]:
    crds = []
    for path in sorted(crd_dir.glob("*.yaml")):
        # libyaml's loader: the Workload CRD is 1.4 MB, which PyYAML's own takes seconds to read.
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "service": {"namespace": KUEUE_NAMESPACE, "name": WEBHOOK_SERVICE, "path": "/convert"}
                    },
                    "conversionReviewVersions": ["v1"],
                },
            }
        crds.append(crd)
    return crds


def install_crds(api: Any, crds: list[dict[str, Any]]) -> None:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api)
    for crd in crds:
        try:
            ext.create_custom_resource_definition(crd)
        except client.ApiException as e:
            if e.status != 409:
                raise
    names = [crd["metadata"]["name"] for crd in crds]

    def established() -> bool:
        for name in names:
            got = ext.read_custom_resource_definition(name)
            if not any(c.type == "Established" and c.status == "True" for c in got.status.conditions or []):
                return False
        return True

    wait_for(established, timeout=60, message="Kueue's CRDs to be established")


def manager_config(cert_dir: Path, health_port: int, webhook_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        # Its aggregated API server authenticates callers through an in-cluster configuration,
        # which a process outside a pod does not have (it exits); no test asks it anything.
        # Elastic workload slices (alpha): on, as a cluster that resizes queued jobs in place runs it;
        # only Jobs annotated kueue.x-k8s.io/elastic-job use them.
        "featureGates": {"VisibilityOnDemand": False, "ElasticJobsViaWorkloadSlices": True},
        # Loopback and a handful of objects: no client-side throttling.
        "clientConnection": {"qps": -1, "burst": 1},
    }


def mount_webhook_secret(core_v1: Any, cert_dir: Path, kueue: Kueue) -> None:
    """What the kubelet would do with the Secret volume: its certificate and key as files."""

    def certificate() -> dict[str, str] | None:
        data = core_v1.read_namespaced_secret(WEBHOOK_SECRET, KUEUE_NAMESPACE).data or {}
        return data if "tls.crt" in data and "tls.key" in data else None

    data = load_controlplane().poll(
        certificate, 60, f"the rotator to fill Secret {WEBHOOK_SECRET}", alive=kueue.alive
    )
    for name in ("tls.crt", "tls.key"):
        tmp = cert_dir / f".{name}.tmp"
        tmp.write_bytes(base64.b64decode(data[name]))
        tmp.replace(cert_dir / name)


def ready(kueue: Kueue) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{kueue.health_port}/readyz", timeout=3) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError:  # 500 until the webhook server has its certificate
        return False


@pytest.fixture(scope="session")
def kueue(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[Kueue]:
    """Kueue's manager, running against the control plane for the rest of the session."""
    cp_module = load_controlplane()
    bin_dir = cp_module.default_bin_dir()
    binary, crd_dir = bin_dir / "kueue", bin_dir / "kueue-crds"
    # Checked before the control plane starts: a skip should cost nothing.
    if not os.access(binary, os.X_OK) or not crd_dir.is_dir():
        _unavailable(f"kueue or kueue-crds missing in {bin_dir}: run hack/cluster-binaries.sh")
    control_plane = request.getfixturevalue("control_plane")
    kube_api = request.getfixturevalue("kube_api")
    core_v1 = request.getfixturevalue("core_v1")

    with summary_plugin.timed(pytestconfig, SUMMARY_SECTION, "install Kueue's CRDs"):
        install_crds(kube_api, kueue_crds(crd_dir))
    core_v1.create_namespace({"metadata": {"name": KUEUE_NAMESPACE}})
    core_v1.create_namespaced_secret(KUEUE_NAMESPACE, {"metadata": {"name": WEBHOOK_SECRET}, "type": "Opaque"})

    work = control_plane.work_dir / "kueue"
    cert_dir = work / "certs"
    cert_dir.mkdir(parents=True)
    health_port = cp_module.free_port()
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(manager_config(cert_dir, health_port, cp_module.free_port())))
    log_path = control_plane.log_dir / "kueue.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(binary), f"--config={config}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)},
            start_new_session=True,
        )
    manager = Kueue(process, log_path, health_port)
    try:
        with summary_plugin.timed(pytestconfig, SUMMARY_SECTION, "start kueue (until /readyz)"):
            mount_webhook_secret(core_v1, cert_dir, manager)
            cp_module.poll(lambda: ready(manager), 120, f"kueue /readyz (log: {log_path})", alive=manager.alive)
        yield manager
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
