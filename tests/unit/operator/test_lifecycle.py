"""The operator's decisions, from observed children and pushed progress to status and actions
(no API server)."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import pytest
from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE
from muralist_api.status import DiffusionJobStatus, Phase
from muralist_operator.decision import (
    REASON_INVALID_SPEC,
    CreateJob,
    DeleteJob,
    DeleteSelf,
    ResizeJob,
    RestoreChildren,
    SetJobSuspend,
    StopPod,
    decide_failed,
    iso,
)
from muralist_operator.lifecycle import decide, eta_text
from muralist_operator.observe import ContainerExit, Observed

from tests.builders import make_job
from tests.views import NOW, failed, index_progress, job_view, pod, progress


def status(**fields: object) -> DiffusionJobStatus:
    return DiffusionJobStatus.model_validate(fields)


def conditions(st: DiffusionJobStatus) -> dict[str, str]:
    return {c.type: c.status for c in st.conditions}


def test_new_job_creates_its_job() -> None:
    d = decide(make_job().job(), status(), 1, Observed(), NOW)
    assert d.actions == [CreateJob(active_deadline_seconds=None)]
    assert d.status.phase == Phase.PENDING
    assert conditions(d.status)["Created"] == "True" and conditions(d.status)["Ready"] == "False"
    assert (d.status.world_size, d.status.data_parallel_degree, d.status.observed_generation) == (1, 1, 1)
    assert d.status.progress.summary == "0/2"


def test_all_pods_running_is_running_and_ready() -> None:
    job = make_job().world(nodes=2).job()
    d = decide(job, status(phase="Pending"), 1, Observed(job=job_view(), pods=[pod(0), pod(1)]), NOW)
    assert d.status.phase == Phase.RUNNING and d.actions == []
    assert conditions(d.status)["Ready"] == "True"
    assert d.status.start_time == iso(NOW - timedelta(seconds=30))
    assert [e.reason for e in d.events] == ["Running"]


def test_a_resize_moves_the_job_and_status_says_what_runs_now() -> None:
    job = make_job().world(nodes=4).job()
    d = decide(job, status(phase="Running"), 2, Observed(job=job_view(completions=2), pods=[pod(0), pod(1)]), NOW)
    assert d.actions == [ResizeJob(4)] and d.status.phase == Phase.RUNNING
    assert (d.status.nodes, d.status.selector) == (2, "app.kubernetes.io/name=muralist,app.kubernetes.io/managed-by="
                                                   "muralist-operator,muralist.dev/job-name=cats,"
                                                   "app.kubernetes.io/component=worker")
    assert [(e.reason, e.message) for e in d.events] == [
        ("Resized", "resizing from 2 to 4 pod(s): the new pods claim work as soon as they start")]
    grown = decide(job, d.status, 2, Observed(job=job_view(completions=4), pods=[pod(i) for i in range(4)]), NOW)
    assert grown.actions == [] and grown.status.nodes == 4


def test_pods_of_indexes_a_resize_removed_are_no_failures() -> None:
    job = make_job().world(nodes=1).job()
    drained = failed(2, code=143, message='{"reason": "Drained", "message": "stopped in chunk 3"}')
    before = status(phase="Running")
    shrink = decide(job, before, 2, Observed(job=job_view(completions=3), pods=[pod(0), pod(1), pod(2)]), NOW)
    assert shrink.actions == [ResizeJob(1)]
    assert "hand back their work" in shrink.events[0].message
    after = decide(job, shrink.status, 2, Observed(job=job_view(completions=1), pods=[pod(0), drained,
                                                                                       failed(1, code=143)]), NOW)
    assert after.actions == [] and after.status.phase == Phase.RUNNING
    assert (after.status.restarts, after.status.indexes, after.events) == (0, [], [])


def test_a_finished_job_is_not_resized() -> None:
    job = make_job().world(nodes=4).job()
    d = decide(job, status(phase="Running"), 2, Observed(job=job_view(completions=2, complete=True)), NOW)
    assert d.status.phase == Phase.SUCCEEDED and d.actions == []


def test_complete_job_succeeds_with_completion_time() -> None:
    d = decide(make_job().job(), status(phase="Running"), 1, Observed(job=job_view(complete=True)), NOW)
    assert d.status.phase == Phase.SUCCEEDED
    assert d.status.completion_time == iso(NOW)
    assert conditions(d.status)["Complete"] == conditions(d.status)["Ready"] == "True"
    p = d.status.progress
    assert (p.completed, p.total, p.percent, p.estimated_seconds_remaining, p.eta) == (2, 2, 100.0, 0, "0s")


def test_once_merged_the_status_counts_are_the_merged_manifests() -> None:
    from muralist_api.contract import Counts
    from muralist_operator.observe import merged_progress

    # The pods counted 9 of 8 (a retried pod's items twice); the merge found 6 rendered (2 of them again in place
    # of another request's), 1 kept, 1 failed.
    counted = progress(index_progress(0, done=5, total=8), index_progress(1, done=4, total=8), total=8)
    pods = [pod(0, "Succeeded", merged=Counts(completed=6, skipped=1, failed=1, total=8, rerendered=2)),
            pod(1, "Succeeded")]
    job = make_job().world(nodes=2).job()
    before = status(phase="Running")
    before.progress.completed = 8  # what an earlier write said
    d = decide(job, before, 1, Observed(job=job_view(complete=True), pods=pods,
                                        progress=merged_progress(counted, pods)), NOW)
    p = d.status.progress
    assert (p.completed, p.failed, p.total, p.kept, p.rerendered) == (7, 1, 8, 1, 2)
    assert d.status.phase == Phase.SUCCEEDED


def test_a_failed_pod_is_retried_alone_and_the_job_stays_running() -> None:
    job = make_job().world(nodes=4).job()
    pods = [pod(0), failed(1, message="rank 1: CUDA error"), pod(2), pod(3)]
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(), pods=pods), NOW)
    assert d.status.phase == Phase.RUNNING and d.actions == []  # the Job controller retries it
    assert d.status.restarts == 1
    assert [(e.index, e.failures) for e in d.status.indexes] == [(1, 1)]
    assert "index 1 is retried (1/3) after: exit code 1: rank 1: CUDA error" in d.status.message
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "PodFailed")]
    # Its retry runs: the message goes back to normal, the count stays.
    again = decide(job, d.status, 1, Observed(job=job_view(), pods=[*pods, pod(1, failures=1)]), NOW)
    assert again.status.restarts == 1 and again.status.message == "4 pod(s), world size 4" and again.events == []


def test_an_index_out_of_retries_fails_the_job() -> None:
    job = make_job().run_policy(maxRestarts=1).job()
    pods = [failed(0, message="boom"), failed(0, failures=1, message="boom again")]
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(), pods=pods), NOW)
    assert d.status.phase == Phase.FAILED and d.status.restarts == 1
    assert "MaxRestartsExceeded" in {c.reason for c in d.status.conditions if c.type == "Failed"}
    assert "index 0 failed 2 times, last: exit code 1: boom again" in d.status.message
    assert conditions(d.status)["Stalled"] == "True"  # kstatus reads this as failed


@pytest.mark.parametrize(
    "term",
    [
        ContainerExit(PERMANENT_FAILURE_EXIT_CODE, "Error", "whatever"),
        ContainerExit(1, "Error", json.dumps({"permanent": True, "message": "FluxTransformer2DModel has no _tp_plan"})),
    ],
)
def test_permanent_error_fails_without_retry(term: ContainerExit) -> None:
    d = decide(
        make_job().job(),
        status(phase="Running"),
        1,
        Observed(job=job_view(failed=True), pods=[pod(0, "Failed", term=term)]),
        NOW,
    )
    assert d.status.phase == Phase.FAILED and d.status.restarts == 0
    assert "permanent" in d.status.message
    assert not any(isinstance(a, CreateJob) for a in d.actions)


def test_runtime_report_message_is_used() -> None:
    term = ContainerExit(1, "Error", json.dumps({"permanent": True, "message": "no _tp_plan"}))
    d = decide(make_job().job(), status(), 1, Observed(job=job_view(), pods=[pod(0, "Failed", term=term)]), NOW)
    assert d.status.message == "index 0 (pod cats-0-0): no _tp_plan (permanent, not retried)"
    assert d.actions == [DeleteJob("PermanentError")]  # exit code 1: the Job's FailJob rule cannot see it


def test_the_first_failed_items_reach_status_message_from_the_termination_message() -> None:
    # What the runtime leaves when its first chunks failed entirely, as the kubelet keeps it on
    # the pod: status.message says why the job failed and names the first items with their reasons.
    from muralist_api.contract import COMPLETION_INDEX_ANNOTATION, Counts
    from muralist_api.contract import Termination as Report
    from muralist_api.pods import RunPolicy
    from muralist_operator.observe import pod_view
    from muralist_runtime.work import item_failures

    nan = "the output has NaN or infinite values (the sampler diverged)"
    verdict = item_failures.chunk_verdict(item_failures.JobTally(4, 0, 12), RunPolicy(), 40)
    assert verdict is not None
    error = item_failures.failure(verdict, [item_failures.describe_item(f"{i:05d}-000", f"u{i}", nan)
                                            for i in range(3)])
    report = Report(Counts(failed=12, total=40), PERMANENT_FAILURE_EXIT_CODE, True, "PermanentFailure", str(error))
    terminated = {"exitCode": PERMANENT_FAILURE_EXIT_CODE, "reason": "Error", "message": report.to_json()}
    body = {"metadata": {"name": "cats-0-0", "annotations": {COMPLETION_INDEX_ANNOTATION: "0"}},
            "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": terminated}}]}}
    observed = Observed(job=job_view(failed=True, failure_reason="PodFailurePolicy"), pods=[pod_view(body)])
    d = decide(make_job().job(), status(phase="Running"), 1, observed, NOW)
    assert d.status.phase == Phase.FAILED and d.status.restarts == 0
    assert {c.type: c.reason for c in d.status.conditions}["Failed"] == "PermanentError"
    assert d.status.message == (
        "index 0 (pod cats-0-0): items: no item completed: the first 4 chunks (12 items) all failed, a systematic "
        f"failure that the rest would share; first failed: 00000-000 (u0): {nan}; 00001-000 (u1): {nan}; "
        f"00002-000 (u2): {nan} (permanent, not retried)")


def test_suspend_and_resume() -> None:
    suspended = make_job().run_policy(suspend=True).job()
    d = decide(suspended, status(phase="Running"), 2, Observed(job=job_view()), NOW)
    assert d.actions == [SetJobSuspend(True)] and d.status.phase == Phase.SUSPENDED
    resumed = decide(make_job().job(), status(phase="Suspended"), 3, Observed(job=job_view(suspended=True)), NOW)
    assert resumed.actions == [SetJobSuspend(False)]
    assert resumed.status.phase == Phase.PENDING


def test_kueue_queued_job_waits_for_admission() -> None:
    job = make_job().run_policy(queueName="gpu").job()
    first = decide(job, status(), 1, Observed(), NOW)
    # The same words from the moment the Job is created as once it is seen waiting.
    assert first.status.phase == Phase.SUSPENDED
    assert first.status.message == "waiting for Kueue to admit it from queue gpu"
    d = decide(job, first.status, 1, Observed(job=job_view(suspended=True)), NOW)
    assert d.actions == [] and d.status.phase == Phase.SUSPENDED
    assert (d.status.message, d.status.conditions) == (first.status.message, first.status.conditions)


def test_a_grow_through_workload_slices_says_which_pods_wait_for_kueue() -> None:
    job = make_job().world(nodes=3).run_policy(queueName="gpu", workloadSlices=True).job()
    pods = [pod(0), pod(1), pod(2, phase="Pending", gated=True)]
    d = decide(job, status(phase="Running"), 2, Observed(job=job_view(completions=3), pods=pods), NOW)
    assert d.actions == [] and d.status.phase == Phase.RUNNING
    assert d.status.message.endswith("; 1 pod(s) wait for Kueue to admit 3 pod(s) from queue gpu (2 running)")
    admitted = decide(job, d.status, 2, Observed(job=job_view(completions=3), pods=[pod(0), pod(1), pod(2)]), NOW)
    assert "Kueue" not in admitted.status.message


def test_deadline_fails_and_stops_the_job() -> None:
    job = make_job().run_policy(activeDeadlineSeconds=60).job()
    st = status(phase="Running", startTime=iso(NOW - timedelta(seconds=61)))
    d = decide(job, st, 1, Observed(job=job_view()), NOW)
    assert d.status.phase == Phase.FAILED and d.actions == [DeleteJob("DeadlineExceeded")]
    assert [c.reason for c in d.status.conditions if c.type == "Failed"] == ["DeadlineExceeded"]


def test_a_job_created_again_gets_the_remaining_deadline() -> None:
    job = make_job().run_policy(activeDeadlineSeconds=100).job()
    st = status(phase="Running", startTime=iso(NOW - timedelta(seconds=40)))
    d = decide(job, st, 1, Observed(), NOW)
    assert d.actions == [CreateJob(active_deadline_seconds=60)]


def test_a_job_being_deleted_is_waited_for() -> None:
    d = decide(make_job().job(), status(phase="Running"), 1, Observed(job=job_view(deleting=True)), NOW)
    assert d.actions == [] and d.status.phase == Phase.PENDING


def test_ttl_deletes_a_finished_job() -> None:
    job = make_job().run_policy(ttlSecondsAfterFinished=10).job()
    st = status(phase="Succeeded", completionTime=iso(NOW - timedelta(seconds=11)))
    assert decide(job, st, 1, Observed(), NOW).actions == [DeleteSelf("ttlSecondsAfterFinished=10 passed")]
    st.completion_time = iso(NOW - timedelta(seconds=5))
    assert decide(job, st, 1, Observed(), NOW).actions == []


def test_pushed_progress_with_rate_and_eta() -> None:
    job = make_job().prompts(*["p"] * 10).generation(imagesPerPrompt=2).world(nodes=2).job()
    pushed = progress(index_progress(0, done=3), index_progress(1, done=4), total=20, ips=0.5, eta=26)
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(), pods=[pod(0), pod(1)], progress=pushed),
               NOW)
    p = d.status.progress
    assert (p.completed, p.total, p.summary, p.percent) == (7, 20, "7/20", 35.0)
    assert (p.images_per_second, p.estimated_seconds_remaining, p.eta) == (0.5, 26, "26s")


def test_counts_never_go_down_when_the_operator_restarts() -> None:
    job = make_job().prompts(*["p"] * 10).job()
    st = status(phase="Running", progress={"completed": 5, "total": 10})
    d = decide(job, st, 1, Observed(job=job_view(), pods=[pod(0)]), NOW)  # nothing pushed yet
    assert d.status.progress.completed == 5 and d.status.progress.summary == "5/10"


@pytest.mark.parametrize(("seconds", "text"), [(None, ""), (0, "0s"), (59, "59s"), (250, "4m10s"),
                                               (7500, "2h05m"), (273600, "3d04h")])
def test_eta_text(seconds: int | None, text: str) -> None:
    assert eta_text(seconds) == text


def test_a_stalled_pod_alone_is_deleted() -> None:
    job = make_job().world(nodes=2).run_policy(stallTimeoutSeconds=60).job()
    pushed = progress(index_progress(0, done=1, last=NOW - timedelta(seconds=300), posted=NOW),
                      index_progress(1, done=1, last=NOW - timedelta(seconds=5), posted=NOW))
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(), pods=[pod(0), pod(1)], progress=pushed), NOW)
    assert d.status.phase == Phase.RUNNING
    note = "no progress for 300s (runPolicy.stallTimeoutSeconds)"
    assert d.actions == [StopPod("cats-0-0", "uid-0-0", "Stalled", note)]
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "Stalled")]


def test_a_hung_pod_is_retried_without_a_stall_timeout_set() -> None:
    job = make_job().world(nodes=1).job()
    assert job.spec.run_policy.stall_timeout_seconds is None
    pushed = progress(index_progress(0, done=1, last=NOW - timedelta(seconds=601), posted=NOW))  # posts, no steps
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(), pods=[pod(0)], progress=pushed), NOW)
    [stop] = d.actions
    assert (stop.name, stop.reason) == ("cats-0-0", "Stalled") and "no progress for 601s" in stop.note


def test_invalid_spec_fails_with_reason() -> None:
    d = decide_failed(status(), 1, REASON_INVALID_SPEC, "spec.x: bad", NOW)
    assert d.status.phase == Phase.FAILED
    assert [(c.reason) for c in d.status.conditions if c.type == "Failed"] == ["InvalidSpec"]
    assert d.events[0].reason == "InvalidSpec"


def test_no_event_without_a_transition() -> None:
    job = make_job().job()
    first = decide(job, status(phase="Running"), 1, Observed(job=job_view(ready=1), pods=[pod(0)]), NOW)
    assert first.events == []


def test_a_complete_job_whose_every_item_failed_is_failed_not_succeeded() -> None:
    # What a runtime image from before maxFailedItems reports: exit 0, every item failed.
    st = status(phase="Running", progress={"completed": 0, "failed": 2, "total": 2})
    d = decide(make_job().job(), st, 1, Observed(job=job_view(complete=True)), NOW)
    assert d.status.phase == Phase.FAILED
    assert "AllItemsFailed" in {c.reason for c in d.status.conditions if c.type == "Failed"}
    assert d.status.message.startswith("every item failed (2 of 2)")
    # One item made is a success with a failed item (runPolicy.maxFailedItems is the runtime's to apply).
    st = status(phase="Running", progress={"completed": 1, "failed": 1, "total": 2})
    assert decide(make_job().job(), st, 1, Observed(job=job_view(complete=True)), NOW).status.phase == Phase.SUCCEEDED


def test_a_finished_job_in_object_storage_says_its_uri() -> None:
    job = make_job("cats").output(uri="s3://renders/runs").job()
    d = decide(job, status(phase=Phase.RUNNING), 1, Observed(job=job_view(complete=True)), NOW)
    assert d.status.phase == Phase.SUCCEEDED and d.status.message.endswith("images in s3://renders/runs/cats")
    assert d.status.output_path == "cats", "the folder inside the uri, as inside a volume"


def test_cache_verify_reaches_status_from_the_pods_termination_messages() -> None:
    # Each pod reports its own share of generation.cache.verify's sample (its ranks summed):
    # the status sums the counts, keeps the lowest figures, and says whether the cache went off.
    from muralist_api.contract import COMPLETION_INDEX_ANNOTATION, CacheSample, Counts
    from muralist_api.contract import Termination as Report
    from muralist_operator.observe import pod_view

    def finished(index: int, sample: CacheSample | None) -> Any:
        report = Report(Counts(completed=2, total=4), cache_sample=sample)
        meta = {"name": f"cats-{index}-0", "annotations": {COMPLETION_INDEX_ANNOTATION: str(index)}}
        return pod_view({"metadata": meta, "status": {"phase": "Succeeded", "containerStatuses": [
                             {"state": {"terminated": {"exitCode": 0, "message": report.to_json()}}}]}})

    job = make_job().generation(cache={"type": "FirstBlockCache", "verify": {"sample": 3, "minPsnr": 20}}).world(
        nodes=2).job()
    pods = [finished(0, CacheSample(2, 31.5, 0.97)), finished(1, CacheSample(1, None, 1.0, cache_off=True))]
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(), pods=pods), NOW)
    verify = d.status.cache_verify
    assert verify is not None
    assert (verify.sampled, verify.min_psnr, verify.min_ssim, verify.cache_off) == (3, 31.5, 0.97, True)
    wire = d.status.model_dump(by_alias=True, exclude_none=True)["cacheVerify"]
    assert wire == {"sampled": 3, "minPsnr": 31.5, "minSsim": 0.97, "cacheOff": True}
    # A pod gone (deleted with its retry) does not shrink what was written.
    later = decide(job, d.status, 1, Observed(job=job_view(), pods=pods[1:]), NOW)
    assert later.status.cache_verify is not None and later.status.cache_verify.sampled == 3
    plain = decide(make_job().job(), status(phase="Running"), 1, Observed(job=job_view(), pods=[finished(0, None)]),
                   NOW)
    assert plain.status.cache_verify is None


# -- pods that never start; children that are gone


def test_a_pod_that_cannot_pull_its_image_is_named_in_status() -> None:
    job = make_job().world(nodes=2).job()
    pull = pod(1, "Pending", waiting_reason="ImagePullBackOff", waiting_message='Back-off pulling image "nope"',
               created=iso(NOW - timedelta(seconds=20)))
    d = decide(job, status(phase="Pending"), 1, Observed(job=job_view(), pods=[pod(0), pull]), NOW)
    assert d.status.phase == Phase.PENDING and d.actions == []
    assert d.status.message == ('1/2 pod(s) running; index 1 (pod cats-1-0): ImagePullBackOff: Back-off pulling '
                                'image "nope"')
    waiting = next(c for c in d.status.conditions if c.type == "PodsNotStarting")
    assert (waiting.status, waiting.reason) == ("True", "ImagePullBackOff")
    # It starts: the condition goes, and the job runs.
    started = decide(job, d.status, 1, Observed(job=job_view(), pods=[pod(0), pod(1)]), NOW)
    assert started.status.phase == Phase.RUNNING and "PodsNotStarting" not in conditions(started.status)


def test_a_pod_that_never_starts_fails_the_job_at_its_timeout() -> None:
    job = make_job().world(nodes=2).run_policy(startTimeoutSeconds=60).job()
    stuck = pod(1, "Pending", waiting_reason="Unschedulable", waiting_message="0/2 nodes are available",
                created=iso(NOW - timedelta(seconds=61)))
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(), pods=[pod(0), stuck]), NOW)
    assert d.status.phase == Phase.FAILED and d.actions == [DeleteJob("Unschedulable")]
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "Unschedulable")]
    # A suspended job's pods are not timed (nor are they there for long).
    paused = decide(job.model_copy(update={"spec": job.spec.model_copy(update={"run_policy": job.spec.run_policy
                    .model_copy(update={"suspend": True})})}), status(phase="Suspended"), 1,
                    Observed(job=job_view(suspended=True), pods=[stuck]), NOW)
    assert paused.status.phase == Phase.SUSPENDED


def test_children_that_are_gone_are_created_again() -> None:
    job = make_job().world(nodes=2).job()
    expected = frozenset({("ConfigMap", "cats-spec"), ("Service", "cats"), ("NetworkPolicy", "cats")})
    seen = Observed(job=job_view(), pods=[pod(0), pod(1)], expected_children=expected,
                    children=frozenset({("ConfigMap", "cats-spec"), ("Service", "cats")}))
    d = decide(job, status(phase="Running"), 1, seen, NOW)
    assert d.actions == [RestoreChildren((("NetworkPolicy", "cats"),))]
    assert [(e.type, e.reason, e.message) for e in d.events] == [
        ("Warning", "ChildRestored", "NetworkPolicy cats was gone: created again")]
    unknown = dataclasses.replace(seen, children=None)  # the indexes are not there: nothing is restored
    assert decide(job, status(phase="Running"), 1, unknown, NOW).actions == []
    done = decide(job, status(phase="Succeeded"), 1, seen, NOW)
    assert done.actions == [], "a finished job's children are left as they are"
    fresh = decide(job, status(), 1, dataclasses.replace(seen, job=None), NOW)
    assert fresh.actions == [CreateJob(None)], "no Job: everything is created (what exists is checked then)"


def test_a_job_whose_posts_stop_keeps_its_pods_and_says_why() -> None:
    job = make_job().world(nodes=2).run_policy(stallTimeoutSeconds=60).job()
    silent = progress(index_progress(0, done=1, last=NOW - timedelta(seconds=300), posted=NOW - timedelta(seconds=290)),
                      index_progress(1, done=1, last=NOW - timedelta(seconds=300), posted=NOW - timedelta(seconds=280)))
    seen = Observed(job=job_view(), pods=[pod(0), pod(1)], progress=silent)
    d = decide(job, status(phase="Running"), 1, seen, NOW)
    assert d.actions == [] and d.status.phase == Phase.RUNNING
    assert conditions(d.status)["ProgressUnreachable"] == "True"
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "ProgressUnreachable")]
    # Where `kubectl get dj -o wide` shows reasons (status.message).
    since = iso(NOW - timedelta(seconds=280))
    assert d.status.message.endswith(f"; progress unreachable: no post accepted since {since}")
    # The job ends meanwhile: nothing waits for posts any more.
    done = decide(job, d.status, 1, dataclasses.replace(seen, job=job_view(complete=True)), NOW)
    assert done.status.phase == Phase.SUCCEEDED and conditions(done.status)["ProgressUnreachable"] == "False"
