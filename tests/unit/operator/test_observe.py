"""What the operator reads from its children's API objects: why a pod has not started, and who
owns what (observe.py), and how the kopf indexes key them (handlers.py)."""

from __future__ import annotations

from typing import Any

import pytest
from muralist_operator import handlers
from muralist_operator.observe import ChildView, controller_uid, job_view, pod_view, waiting


def container(state: dict[str, Any]) -> dict[str, Any]:
    return {"name": "runtime", "state": state}


SCHEDULED = {"type": "PodScheduled", "status": "True"}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Pending"}, ("", "")),  # just created
        ({"phase": "Pending", "conditions": [SCHEDULED],
          "containerStatuses": [container({"waiting": {"reason": "ContainerCreating"}})]}, ("", "")),
        ({"phase": "Pending", "conditions": [SCHEDULED], "containerStatuses": [container(
            {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope"'}})]},
         ("ImagePullBackOff", 'Back-off pulling image "nope"')),
        ({"phase": "Pending", "containerStatuses": [container(
            {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}})]},
         ("CreateContainerConfigError", 'secret "hf-token" not found')),
        ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                              "message": "0/2 nodes are available: 2 node(s) didn't match Pod's "
                                              "node affinity/selector."}]},
         ("Unschedulable", "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.")),
        ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                              "message": "Scheduling is blocked due to non-empty scheduling gates"}]},
         ("", "")),
        # A container's own reason says more than the scheduler's (an init container first).
        ({"phase": "Pending", "initContainerStatuses": [container({"waiting": {"reason": "ErrImagePull"}})],
          "containerStatuses": [container({"waiting": {"reason": "PodInitializing"}})]}, ("ErrImagePull", "")),
        # Started: what it waits for now is no start's.
        ({"phase": "Running", "containerStatuses": [container({"waiting": {"reason": "CrashLoopBackOff"}})]},
         ("", "")),
    ],
    ids=["created", "creating", "image-pull", "missing-secret", "unschedulable", "gated", "init-first", "running"],
)
def test_why_a_pod_has_not_started(status: dict[str, Any], expected: tuple[str, str]) -> None:
    assert waiting(status) == expected


def owned(kind: str, name: str, uid: str, controller: bool = True) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": controller}]


def test_views_carry_their_controllers_uid() -> None:
    job = {"metadata": {"name": "cats", "uid": "j", "ownerReferences": owned("DiffusionJob", "cats", "dj")},
           "spec": {"completions": 2}}
    assert (job_view(job).uid, job_view(job).owner_uid, job_view(job).completions) == ("j", "dj", 2)
    pod = {"metadata": {"name": "cats-0-x", "uid": "p", "ownerReferences": owned("Job", "cats", "j")},
           "spec": {"nodeName": "kwok-gpu-0"}, "status": {"phase": "Pending"}}
    view = pod_view(pod)
    assert (view.owner_uid, view.scheduled, view.index, view.generation) == ("j", True, -1, 1)
    pod["metadata"]["generation"] = 2  # its scheduling gate lifted
    assert pod_view(pod).generation == 2
    # An owner that is no controller (a reference anyone may add) owns nothing here.
    assert controller_uid({"metadata": {"ownerReferences": owned("Job", "cats", "j", controller=False)}}) == ""


def test_indexes_key_children_by_their_controller_not_their_label() -> None:
    labels = {"muralist.dev/job-name": "cats", "app.kubernetes.io/component": "worker"}
    ours = {"kind": "ConfigMap", "metadata": {"name": "cats-spec", "labels": labels,
                                              "ownerReferences": owned("DiffusionJob", "cats", "dj")}}
    assert handlers.muralist_config_maps(namespace="ns", body=ours) == {
        ("ns", "cats"): ChildView("ConfigMap", "cats-spec", "dj")}
    # Labelled as a job's, owned by nobody (or by something else): not indexed at all.
    stray = {"kind": "Pod", "metadata": {"name": "cats-0", "labels": labels}, "status": {}}
    assert handlers.muralist_pods(namespace="ns", body=stray) == {}
    other = {"kind": "Job", "metadata": {"name": "cats", "labels": labels,
                                         "ownerReferences": owned("CronJob", "nightly", "c")}}
    assert handlers.muralist_jobs(namespace="ns", body=other) == {}
    pod = {"kind": "Pod", "metadata": {"name": "cats-0-x", "labels": labels,
                                       "ownerReferences": owned("Job", "cats", "j"),
                                       "annotations": {"batch.kubernetes.io/job-completion-index": "0"}}}
    [(key, view)] = handlers.muralist_pods(namespace="ns", body=pod).items()
    assert key == ("ns", "cats") and (view.index, view.owner_uid) == (0, "j")


def finished_pod(index: int, message: dict[str, Any]) -> dict[str, Any]:
    import json

    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    return {"metadata": {"name": f"cats-{index}", "annotations": annotations},
            "status": {"phase": "Succeeded", "containerStatuses": [
                {"state": {"terminated": {"exitCode": 0, "message": json.dumps(message)}}}]}}


def test_once_the_first_pod_merged_the_status_counts_are_the_manifests() -> None:
    from muralist_operator.observe import merged_progress
    from muralist_operator.progress.snapshot import JobProgress

    # What the pods counted while they rendered: pod 1's retry counted a chunk again, pod 0 kept one it found.
    counted = JobProgress(completed=9, failed=0, total=8, percent=100.0, images_per_second=2.0,
                          estimated_seconds_remaining=0, ranks=2, indexes={}, kept=1, rerendered=0)
    pods = [pod_view(finished_pod(1, {"completed": 5, "skipped": 0, "failed": 0, "total": 8})),
            pod_view(finished_pod(0, {"completed": 3, "skipped": 1, "failed": 0, "total": 8,
                                      "job": {"completed": 6, "skipped": 1, "failed": 1, "total": 8,
                                              "rerendered": 2}}))]
    assert merged_progress(counted, pods[:1]) == counted, "not merged yet: the pods' counts"
    merged = merged_progress(counted, pods)
    assert merged is not None
    assert (merged.completed, merged.failed, merged.total, merged.kept, merged.rerendered, merged.percent) == (
        7, 1, 8, 1, 2, 100.0)
    assert merged.status_fields()["kept"] == 1 and merged.images_per_second == 2.0


def test_the_steps_checkpoints_saved_and_lost_reach_the_status_from_the_merge() -> None:
    from muralist_api.status import DiffusionJobStatus
    from muralist_operator.lifecycle import apply_progress
    from muralist_operator.observe import merged_progress
    from muralist_operator.progress.snapshot import JobProgress

    counted = JobProgress(completed=2, failed=0, total=2, percent=100.0, images_per_second=1.0,
                          estimated_seconds_remaining=0, ranks=1, indexes={})
    job = {"completed": 2, "skipped": 0, "failed": 0, "total": 2}
    without = pod_view(finished_pod(0, {**job, "job": job}))
    with_steps = pod_view(finished_pod(0, {**job, "job": job, "checkpoints": {"stepsSaved": 12, "stepsLost": 3}}))
    status = DiffusionJobStatus()
    apply_progress(status, merged_progress(counted, [without]), None)
    assert (status.progress.steps_saved, status.progress.steps_lost) == (None, None), "no checkpoints: unset"
    apply_progress(status, merged_progress(counted, [with_steps]), None)
    assert (status.progress.steps_saved, status.progress.steps_lost) == (12, 3)
    assert status.model_dump(by_alias=True)["progress"]["stepsSaved"] == 12
