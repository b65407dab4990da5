"""The skew matrix, operator half: the operator of the release before (SKEW_BASELINE in hack/versions.env,
taken out of git by tests/skew_helpers.py) and this tree's, against objects stored under either CRD.

One running job (kwok keeps its pods Running) lives through what a platform team does on its own
schedule: created under the old CRD by the old operator; this tree's CRD applied under it (the README's
order: the CRD first); this tree's operator in its place (the upgrade); the old operator back, the new
CRD left applied (a rollback). After each step the operator in charge reconciles a resize of the job, so
it has read the object as the API server now returns it, defaults of the new CRD included: the job stays
Running throughout and is never Failed (InvalidSpec was what an older operator made of a field a newer
CRD defaulted: crd.py now defaults only fields the baseline knows).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from muralist_api.job import GROUP, PLURAL, VERSION

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, wait_for
from tests.operator_helpers import DJ, OperatorProcess, apply_crd
from tests.paths import REPO
from tests.skew_helpers import baseline_commit, baseline_tree, pythonpath

__all__ = ["baseline_tree"]  # the fixture, for pytest
pytestmark = pytest.mark.cluster
NAME = "skewed"


def baseline_crd() -> dict[str, Any]:
    shown = subprocess.run(["git", "show", f"{baseline_commit()}:crds/muralist.dev_diffusionjobs.yaml"], cwd=REPO,
                           capture_output=True, text=True, check=True)
    crd: dict[str, Any] = yaml.safe_load(shown.stdout)
    return crd


class Phases:
    """Every (phase, message) the job's status shows, from a watch: a flicker between two polls counts."""

    def __init__(self, api: Any, namespace: str):
        self.seen: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._custom = client.CustomObjectsApi(api)
        self._namespace = namespace
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(self._custom.list_namespaced_custom_object, GROUP, VERSION,
                                                  self._namespace, PLURAL, field_selector=f"metadata.name={NAME}",
                                                  timeout_seconds=5):
                    status = event["object"].get("status") or {}
                    if status.get("phase"):
                        self.seen.append((status["phase"], status.get("message", "")))
            except Exception:  # the API server between two CRDs: watch again
                self._stop.wait(0.2)

    def stop(self) -> list[tuple[str, str]]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.seen


def resized(dj: DJ, nodes: int, by: str) -> dict[str, Any]:
    """Resize the job and wait until the operator in charge has reconciled it (status.nodes)."""
    dj.patch_spec(NAME, {"parallelism": {"nodes": nodes}})
    def reconciled() -> dict[str, Any] | None:
        status = dj.status(NAME)
        return status if status.get("nodes") == nodes or status.get("phase") == "Failed" else None

    status = wait_for(reconciled, timeout=60, message=f"{by} to resize {NAME} to {nodes}")
    assert status.get("phase") != "Failed", f"{by} failed the job: {status.get('message')}"
    return status


@pytest.fixture
def old_operator(control_plane: Any, baseline_tree: Path, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(control_plane.kubeconfig, tmp_path, env={"PYTHONPATH": pythonpath(baseline_tree)})
    try:
        yield op
    finally:
        op.stop()


def test_a_running_job_survives_a_crd_upgrade_and_an_operator_downgrade(
        kube_api: Any, crd: dict[str, Any], namespace: str, operator: OperatorProcess,
        old_operator: OperatorProcess) -> None:
    dj = DJ(kube_api, namespace)
    operator.kill()  # this tree's operator steps aside until step 3
    phases = Phases(kube_api, namespace)
    try:
        apply_crd(kube_api, baseline_crd())
        old_operator.start()
        # 1. The release before: its CRD, its operator.
        # An output every pod mounts (a job of several pods must have one) and the scheduler needs no claim for.
        dj.create(make_job(NAME).output(volume={"hostPath": {"path": "/tmp/muralist-skew"}}).world(nodes=2, gpus=1)
                  .pod_template(annotations=fate_annotations("run")).obj())
        dj.wait_pods(NAME, 2)
        dj.wait_phase(NAME, "Running")
        # 2. This tree's CRD applied first; the old operator reads the job as the API server returns it now.
        apply_crd(kube_api, crd)
        resized(dj, 1, "the old operator under the new CRD")
        # 3. The operator upgraded.
        old_operator.stop()
        operator.start()
        resized(dj, 2, "this tree's operator")
        # 4. The operator rolled back; the new CRD stays.
        operator.kill()
        old_operator.start()
        status = resized(dj, 1, "the old operator again")
        assert status["phase"] == "Running", status
    except BaseException:
        jobs = [(j.metadata.name, j.spec.parallelism, j.status.active)
                for j in dj.batch.list_namespaced_job(dj.ns).items]
        pods = [(p.metadata.name, p.status.phase) for p in dj.pods(NAME)]
        sys.stderr.write(f"\n--- status {dj.status(NAME)}\n--- Jobs {jobs}\n--- pods {pods}\n"
                         f"--- the old operator's log\n{old_operator.logs()[-6000:]}\n"
                         f"--- this tree's operator's log\n{operator.logs()[-3000:]}\n")
        raise
    finally:
        seen = phases.stop()
        old_operator.stop()
        apply_crd(kube_api, crd)
        if operator.proc is None or operator.proc.poll() is not None:
            operator.start()
    phases_seen = [phase for phase, _ in seen]
    assert "Running" in phases_seen, seen
    after_running = seen[phases_seen.index("Running"):]
    assert {phase for phase, _ in after_running} == {"Running"}, f"the job left Running: {after_running}"
    assert not {"InvalidSpec", "Failed"} & set(dj.events(NAME)), dj.events(NAME)
