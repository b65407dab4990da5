"""deploy/argocd/health.lua run by a real Lua interpreter (lupa), Argo CD style: a global `obj`
in, a table `{status=..., message=...}` out; and the kstatus reading of the operator's status."""

from __future__ import annotations

from typing import Any

import pytest
from muralist_api.status import DiffusionJobStatus
from muralist_operator.lifecycle import decide
from muralist_operator.observe import ContainerExit, Observed

from tests.builders import make_job
from tests.paths import REPO
from tests.views import NOW, job_view
from tests.views import pod as make_pod

lupa = pytest.importorskip("lupa")

HEALTH_LUA = REPO / "deploy" / "argocd" / "health.lua"


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """Evaluate the script as Argo CD does: `obj` is a global, the chunk returns the health."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(HEALTH_LUA.read_text())
    return dict(result.items())


def dj(status: dict[str, Any] | None = None, generation: int = 1) -> dict[str, Any]:
    obj = make_job("cats").obj()
    obj["metadata"]["generation"] = generation
    if status is not None:
        obj["status"] = {"observedGeneration": generation, **status}
    return obj


def progress(completed: int, total: int) -> dict[str, Any]:
    return {"completed": completed, "total": total, "failed": 0, "summary": f"{completed}/{total}"}


# (case, object, expected health status, expected message)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("no status", dj(), "Progressing", "Waiting for the operator to report a status"),
    ("empty status", {**dj(), "status": {}}, "Progressing", "Waiting for the operator to report a status"),
    ("pending", dj({"phase": "Pending", "progress": progress(0, 16), "message": "Created"}),
     "Progressing", "Pending (0/16 images): Created"),
    ("running", dj({"phase": "Running", "progress": progress(3, 16), "message": "2 pods running"}),
     "Progressing", "Running (3/16 images): 2 pods running"),
    ("running, summary missing", dj({"phase": "Running", "progress": {"completed": 5, "total": 8}}),
     "Progressing", "Running (5/8 images)"),
    ("restarting", dj({"phase": "Restarting", "progress": progress(7, 16), "restarts": 1,
                       "message": "pod 1 failed: NCCL timeout"}),
     "Progressing", "Restarting (7/16 images): pod 1 failed: NCCL timeout"),
    ("suspended", dj({"phase": "Suspended", "progress": progress(4, 16), "message": "runPolicy.suspend is true"}),
     "Suspended", "Suspended (4/16 images): runPolicy.suspend is true"),
    ("succeeded", dj({"phase": "Succeeded", "progress": progress(16, 16), "message": "Succeeded"}),
     "Healthy", "Succeeded (16/16 images)"),
    ("failed", dj({"phase": "Failed", "progress": progress(2, 16), "message": "pod 0 failed: out of memory"}),
     "Degraded", "Failed (2/16 images): pod 0 failed: out of memory"),
    ("failed, no progress", dj({"phase": "Failed", "message": "spec.parallelism: invalid"}),
     "Degraded", "Failed: spec.parallelism: invalid"),
    ("status of an older generation", dj({"phase": "Succeeded"}, generation=1) | {
        "metadata": {"name": "cats", "generation": 2}},
     "Progressing", "Waiting for the operator to observe generation 2"),
    ("no observedGeneration yet", {**dj(generation=3), "status": {"phase": "Running"}},
     "Progressing", "Waiting for the operator to observe generation 3"),
    ("unknown phase", dj({"phase": "Exploded"}), "Unknown", "Exploded"),
]


@pytest.mark.parametrize(("obj", "status", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_argocd_health(obj: dict[str, Any], status: str, message: str) -> None:
    assert argocd_health(obj) == {"status": status, "message": message}


# -- kstatus: what Flux, `kubectl wait` and cli-utils conclude from the same status


def kstatus(obj: dict[str, Any]) -> str:
    """The kstatus rules for a custom resource with standard conditions (sigs.k8s.io/cli-utils)."""
    status = obj.get("status") or {}
    generation = obj["metadata"].get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        return "InProgress"
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    if conditions.get("Stalled") == "True":
        return "Failed"
    if conditions.get("Reconciling") == "True":
        return "InProgress"
    if conditions.get("Ready") == "False":
        return "InProgress"
    if conditions.get("Ready") == "True":
        return "Current"
    return "Current"  # no conditions to read: kstatus takes the object as it is


def decided(observed: Observed, generation: int = 1, **policy: Any) -> dict[str, Any]:
    """The object as the API server would serve it after the operator's status write."""
    builder = make_job("cats")
    if policy:
        builder = builder.run_policy(**policy)
    status = decide(builder.job(), DiffusionJobStatus(), generation, observed, NOW).status
    obj = builder.obj()
    obj["metadata"]["generation"] = generation
    obj["status"] = status.wire()
    return obj


DECIDED = {
    "created": (Observed(), "InProgress", "Progressing"),
    "running": (Observed(job=job_view(), pods=[make_pod()]), "Current", "Progressing"),
    "succeeded": (Observed(job=job_view(complete=True)), "Current", "Healthy"),
    "failed": (Observed(job=job_view(failed=True), pods=[make_pod(phase="Failed", term=ContainerExit(2, "E", "oom"))]),
               "Failed", "Degraded"),
}


@pytest.mark.parametrize(("observed", "expected_kstatus", "expected_health"), DECIDED.values(), ids=DECIDED.keys())
def test_operator_status_reads_right_for_kstatus_and_argocd(observed: Observed, expected_kstatus: str,
                                                             expected_health: str) -> None:
    # maxRestarts 0: a failed pod fails the job at once instead of restarting the group.
    obj = decided(observed, maxRestarts=0)
    assert kstatus(obj) == expected_kstatus
    assert argocd_health(obj)["status"] == expected_health


def test_spec_change_not_yet_observed_is_in_progress_for_both() -> None:
    obj = decided(Observed(job=job_view(complete=True)))
    obj["metadata"]["generation"] = 2
    assert kstatus(obj) == "InProgress"
    assert argocd_health(obj)["status"] == "Progressing"
