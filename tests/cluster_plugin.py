"""pytest plugin: a real Kubernetes control plane for tests marked `cluster`.

Registered from tests/conftest.py (`pytest_plugins = ["tests.cluster_plugin"]`). The control
plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok with two fake GPU
nodes, run by kwokctl) is started once per session from the binaries hack/cluster-binaries.sh
builds, found in $MURALIST_K8S_BIN or the build cache for the version pinned in
hack/versions.env. Without them the cluster tests are skipped, unless
MURALIST_REQUIRE_CLUSTER=1 (CI), where that is a failure.

Fixtures: `control_plane` (session; hack/controlplane.py's ControlPlane), `kube_api` (session;
a kubernetes.client.ApiClient for the admin kubeconfig), `core_v1`, and `namespace` (a fresh
namespace per test, deleted afterwards). Helpers live in tests/kube_helpers.py.

When a test of the session fails, the components' logs (and kwokctl's) are copied to
$TMPDIR/muralist-controlplane-logs-<pid> and the path is printed in the terminal summary.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests import summary_plugin
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for

__all__ = ["fate_annotations", "load_controlplane", "set_pod_fate", "wait_for"]

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTROLPLANE_PY = REPO_ROOT / "hack" / "controlplane.py"


def load_controlplane() -> ModuleType:
    """Import hack/controlplane.py (hack/ is scripts, not a package)."""
    name = "muralist_hack_controlplane"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, CONTROLPLANE_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs the real control plane built by hack/cluster-binaries.sh")


def _unavailable(reason: str) -> None:
    if os.environ.get("MURALIST_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"{reason} (MURALIST_REQUIRE_CLUSTER=1)", pytrace=False)
    pytest.skip(reason)


def _keep_logs(config: pytest.Config, log_dir: Path) -> None:
    target = Path(tempfile.gettempdir()) / f"muralist-controlplane-logs-{os.getpid()}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(log_dir, target)
    summary_plugin.note(config, "logs kept", "control plane", str(target))


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    cp_module = load_controlplane()
    bin_dir = cp_module.default_bin_dir()
    missing = cp_module.missing_binaries(bin_dir)
    if missing:
        _unavailable(
            f"control plane binaries missing in {bin_dir} ({', '.join(missing)}): run hack/cluster-binaries.sh"
        )
    cp = cp_module.ControlPlane(bin_dir, tmp_path_factory.mktemp("controlplane"))
    try:
        cp.start()
    except cp_module.ControlPlaneError as exc:
        _keep_logs(request.config, cp.log_dir)
        pytest.fail(f"control plane did not start: {exc}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()
        if request.session.testsfailed:
            _keep_logs(request.config, cp.log_dir)


@pytest.fixture(scope="session")
def kube_api(control_plane: Any) -> Iterator[Any]:
    """A kubernetes.client.ApiClient authenticated as cluster admin."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def core_v1(kube_api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(kube_api)


@pytest.fixture
def namespace(core_v1: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace whose `default` ServiceAccount exists (pods need it to be admitted)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core_v1.create_namespace(
        {
            "metadata": {
                "name": name,
                "labels": {"muralist.dev/test": "true"},
                "annotations": {"muralist.dev/test-node-id": request.node.nodeid},
            }
        }
    )
    wait_for(
        lambda: core_v1.read_namespaced_service_account("default", name),
        timeout=30,
        message=f"ServiceAccount {name}/default",
    )
    try:
        yield name
    finally:
        # The namespace controller finishes deleting in the background; no test waits for it.
        core_v1.delete_namespace(name)
