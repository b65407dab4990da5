"""The operator's decisions, from observed children to status and actions (no API server)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from muralist_operator.decision import (
    REASON_INVALID_SPEC,
    CreateJob,
    DeleteJob,
    DeleteSelf,
    SetJobSuspend,
    decide_failed,
    iso,
)
from muralist_operator.lifecycle import decide
from muralist_operator.observe import Observed, RankReport, Termination, rank_reports
from muralist_runtime.spec.contract import PERMANENT_FAILURE_EXIT_CODE
from muralist_runtime.spec.status import DiffusionJobStatus, Phase

from tests.builders import make_job
from tests.views import NOW, job_view, pod


def status(**fields: object) -> DiffusionJobStatus:
    return DiffusionJobStatus.model_validate(fields)


def conditions(st: DiffusionJobStatus) -> dict[str, str]:
    return {c.type: c.status for c in st.conditions}


def test_new_job_creates_its_pod_group() -> None:
    d = decide(make_job().job(), status(), 1, Observed(), NOW)
    assert d.actions == [CreateJob(attempt=0, active_deadline_seconds=None)]
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


def test_complete_job_succeeds_with_completion_time() -> None:
    d = decide(make_job().job(), status(phase="Running"), 1, Observed(job=job_view(complete=True)), NOW)
    assert d.status.phase == Phase.SUCCEEDED
    assert d.status.completion_time == iso(NOW)
    assert conditions(d.status)["Complete"] == conditions(d.status)["Ready"] == "True"
    assert d.status.progress.completed == d.status.progress.total == 2


def test_failed_pod_restarts_the_group_and_counts() -> None:
    failed = pod(1, "Failed", term=Termination(1, "Error", "rank 1: CUDA error"))
    job = make_job().world(nodes=2).job()
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(failed=True), pods=[pod(0), failed]), NOW)
    assert d.status.phase == Phase.RESTARTING and d.status.restarts == 1
    assert d.actions == [DeleteJob("PodFailed")]
    assert "pod 1 failed: rank 1: CUDA error" in d.status.message
    assert d.events[0].type == "Warning"


def test_next_group_is_created_once_the_old_one_is_gone() -> None:
    st = status(phase="Restarting", restarts=1)
    stale = decide(make_job().job(), st, 1, Observed(job=job_view(attempt=0, failed=True)), NOW)
    assert stale.actions == [DeleteJob("stale pod group")] and stale.status.restarts == 1
    gone = decide(make_job().job(), st, 1, Observed(), NOW)
    assert gone.actions == [CreateJob(attempt=1, active_deadline_seconds=None)]
    assert gone.status.phase == Phase.RESTARTING


def test_restarts_beyond_max_fail() -> None:
    job = make_job().run_policy(maxRestarts=1).job()
    failed = pod(0, "Failed", attempt=1, term=Termination(1, "Error", "boom"))
    d = decide(
        job, status(phase="Running", restarts=1), 1, Observed(job=job_view(attempt=1, failed=True), pods=[failed]), NOW
    )
    assert d.status.phase == Phase.FAILED and d.status.restarts == 1
    assert "MaxRestartsExceeded" in {c.reason for c in d.status.conditions if c.type == "Failed"}
    assert conditions(d.status)["Stalled"] == "True"  # kstatus reads this as failed


@pytest.mark.parametrize(
    "term",
    [
        Termination(PERMANENT_FAILURE_EXIT_CODE, "Error", "whatever"),
        Termination(1, "Error", json.dumps({"permanent": True, "message": "FluxTransformer2DModel has no _tp_plan"})),
    ],
)
def test_permanent_error_fails_without_restart(term: Termination) -> None:
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
    term = Termination(1, "Error", json.dumps({"permanent": True, "message": "no _tp_plan"}))
    d = decide(make_job().job(), status(), 1, Observed(job=job_view(), pods=[pod(0, "Failed", term=term)]), NOW)
    assert d.status.message == "pod 0: no _tp_plan (permanent, not restarted)"


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


def test_deadline_fails_and_stops_the_group() -> None:
    job = make_job().run_policy(activeDeadlineSeconds=60).job()
    st = status(phase="Running", startTime=iso(NOW - timedelta(seconds=61)))
    d = decide(job, st, 1, Observed(job=job_view()), NOW)
    assert d.status.phase == Phase.FAILED and d.actions == [DeleteJob("DeadlineExceeded")]
    assert [c.reason for c in d.status.conditions if c.type == "Failed"] == ["DeadlineExceeded"]


def test_restarted_group_gets_the_remaining_deadline() -> None:
    job = make_job().run_policy(activeDeadlineSeconds=100).job()
    st = status(phase="Restarting", restarts=1, startTime=iso(NOW - timedelta(seconds=40)))
    d = decide(job, st, 1, Observed(), NOW)
    assert d.actions == [CreateJob(attempt=1, active_deadline_seconds=60)]


def test_ttl_deletes_a_finished_job() -> None:
    job = make_job().run_policy(ttlSecondsAfterFinished=10).job()
    st = status(phase="Succeeded", completionTime=iso(NOW - timedelta(seconds=11)))
    assert decide(job, st, 1, Observed(), NOW).actions == [DeleteSelf("ttlSecondsAfterFinished=10 passed")]
    st.completion_time = iso(NOW - timedelta(seconds=5))
    assert decide(job, st, 1, Observed(), NOW).actions == []


def test_progress_sums_writing_ranks() -> None:
    ranks = rank_reports(
        {
            "rank-0": json.dumps({"attempt": 0, "completed": 2, "skipped": 1, "failed": 0, "total": 5}),
            "rank-1": json.dumps({"attempt": 0, "completed": 3, "skipped": 0, "failed": 1, "total": 5}),
            "rank-2": "not json",
        }
    )
    job = make_job().prompts(*["p"] * 10).world(nodes=2).job()
    d = decide(job, status(phase="Running"), 1, Observed(job=job_view(), pods=[pod(0), pod(1)], ranks=ranks), NOW)
    p = d.status.progress
    assert (p.completed, p.failed, p.total, p.summary) == (6, 1, 10, "6/10")


def test_stalled_group_is_restarted() -> None:
    job = make_job().world(nodes=2).run_policy(stallTimeoutSeconds=60).job()
    old = iso(NOW - timedelta(seconds=300))
    ranks = {"rank-0": RankReport(0, 1, 0, 0, 5, old), "rank-1": RankReport(0, 5, 0, 0, 5, old)}
    d = decide(
        job, status(phase="Running"), 1, Observed(job=job_view(start_time=old), pods=[pod(0), pod(1)], ranks=ranks), NOW
    )
    assert d.status.phase == Phase.RESTARTING and "no progress for 300s" in d.status.message
    fresh = {"rank-0": RankReport(0, 1, 0, 0, 5, iso(NOW)), "rank-1": ranks["rank-1"]}
    ok = decide(
        job, status(phase="Running"), 1, Observed(job=job_view(start_time=old), pods=[pod(0), pod(1)], ranks=fresh), NOW
    )
    assert ok.status.phase == Phase.RUNNING  # rank 1 is done; its silence is expected


def test_invalid_spec_fails_with_reason() -> None:
    d = decide_failed(status(), 1, REASON_INVALID_SPEC, "spec.x: bad", NOW)
    assert d.status.phase == Phase.FAILED
    assert [(c.reason) for c in d.status.conditions if c.type == "Failed"] == ["InvalidSpec"]
    assert d.events[0].reason == "InvalidSpec"


def test_no_event_without_a_transition() -> None:
    job = make_job().job()
    first = decide(job, status(phase="Running"), 1, Observed(job=job_view(ready=1), pods=[pod(0)]), NOW)
    assert first.events == []


def test_stall_clock_starts_at_the_first_step() -> None:
    job = make_job().world(nodes=2).run_policy(stallTimeoutSeconds=60).job()
    old = iso(NOW - timedelta(seconds=300))
    loading = {"rank-0": RankReport(0, 0, 0, 0, 5, None), "rank-1": RankReport(0, 0, 0, 0, 5, None)}
    d = decide(
        job,
        status(phase="Running"),
        1,
        Observed(job=job_view(start_time=old), pods=[pod(0), pod(1)], ranks=loading),
        NOW,
    )
    assert d.status.phase == Phase.RUNNING
    previous = {"rank-0": RankReport(0, 1, 0, 0, 5, old)}  # a report of the group before the restart
    d = decide(
        job,
        status(phase="Running", restarts=1),
        1,
        Observed(job=job_view(attempt=1, start_time=old), pods=[pod(0, attempt=1), pod(1, attempt=1)], ranks=previous),
        NOW,
    )
    assert d.status.phase == Phase.RUNNING
