"""Each lifecycle policy on its own, as tables of cases (lifecycle.decide composes them)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from muralist_operator.decision import (
    REASON_MAX_RESTARTS,
    REASON_PERMANENT,
    REASON_POD_FAILED,
    DeleteJob,
    SetJobSuspend,
    Transition,
    iso,
)
from muralist_operator.observe import RankReport, Termination
from muralist_operator.policies import deadline, failure, stall, suspension, ttl
from muralist_runtime.spec.api import RunPolicy
from muralist_runtime.spec.status import DiffusionJobStatus, Phase

from tests.builders import make_job
from tests.views import NOW, job_view, pod


def ago(seconds: float) -> str:
    return iso(NOW - timedelta(seconds=seconds))


@pytest.mark.parametrize(
    ("ttl_seconds", "finished", "expected"),
    [
        (None, ago(1000), None),
        (10, None, None),
        (10, ago(5), None),
        (10, ago(10), "ttlSecondsAfterFinished=10 passed"),
        (0, ago(0), "ttlSecondsAfterFinished=0 passed"),
    ],
)
def test_ttl(ttl_seconds: int | None, finished: str | None, expected: str | None) -> None:
    status = DiffusionJobStatus(phase=Phase.SUCCEEDED, completion_time=finished)
    assert ttl.expired(status, RunPolicy(ttl_seconds_after_finished=ttl_seconds), NOW) == expected


@pytest.mark.parametrize(
    ("limit", "started", "exceeded", "remaining"),
    [
        (None, ago(10**6), False, None),
        (60, None, False, 60),
        (60, ago(20), False, 40),
        (60, ago(59), False, 1),
        (60, ago(60), True, 1),
    ],
)
def test_deadline(limit: int | None, started: str | None, exceeded: bool, remaining: int | None) -> None:
    status, policy = DiffusionJobStatus(start_time=started), RunPolicy(active_deadline_seconds=limit)
    assert deadline.exceeded(status, policy, NOW) is exceeded
    assert deadline.remaining(status, policy, NOW) == remaining


@pytest.mark.parametrize(
    ("policy", "job", "action", "suspended", "reason"),
    [
        (RunPolicy(), job_view(), None, False, None),
        (RunPolicy(suspend=True), job_view(), SetJobSuspend(True), True, "Suspended"),
        (RunPolicy(suspend=True), job_view(suspended=True), None, True, "Suspended"),
        (RunPolicy(), job_view(suspended=True), SetJobSuspend(False), False, None),
        # Kueue unsuspends an admitted Job itself; until then the job waits in its queue.
        (RunPolicy(queue_name="gpus"), job_view(suspended=True), None, True, "Queued"),
        (RunPolicy(queue_name="gpus"), job_view(), None, False, None),
        (RunPolicy(suspend=True), job_view(complete=True), None, False, None),
    ],
    ids=["running", "suspend", "suspended", "resume", "queued", "admitted", "finished"],
)
def test_suspension(policy: RunPolicy, job, action, suspended: bool, reason: str | None) -> None:
    assert suspension.action(policy, job) == action
    assert suspension.is_suspended(policy, job) is suspended
    if reason:
        assert suspension.reason(policy)[0] == reason


PERMANENT = Termination(1, "Error", '{"permanent": true, "message": "spec.x: no"}')
RETRYABLE = Termination(1, "Error", "NCCL timeout")


@pytest.mark.parametrize(
    ("pods", "restarts", "max_restarts", "phase", "reason", "restarted"),
    [
        ([pod(0, "Failed", term=RETRYABLE), pod(1)], 0, 3, Phase.RESTARTING, REASON_POD_FAILED, 1),
        ([pod(0, "Failed", term=RETRYABLE)], 3, 3, Phase.FAILED, REASON_MAX_RESTARTS, 3),
        # A permanent failure on any pod decides, even when another pod failed first.
        ([pod(0, "Failed", term=RETRYABLE), pod(1, "Failed", term=PERMANENT)], 0, 3, Phase.FAILED,
         REASON_PERMANENT, 0),
        ([pod(0, "Failed", term=Termination(78, "Error", "log tail"))], 0, 3, Phase.FAILED, REASON_PERMANENT, 0),
    ],
    ids=["retry", "out-of-restarts", "permanent-wins", "exit-78"],
)
def test_failure(pods, restarts: int, max_restarts: int, phase: Phase, reason: str, restarted: int) -> None:
    job = make_job().run_policy(maxRestarts=max_restarts).job()
    t = Transition(DiffusionJobStatus(phase=Phase.RUNNING, restarts=restarts), 1, NOW)
    assert failure.handle_failure(t, job, job_view(), pods) is True
    assert (t.status.phase, t.status.restarts) == (phase, restarted)
    assert [c.reason for c in t.status.conditions if c.type in ("Failed", "Restarting")] == [reason]
    assert any(isinstance(a, DeleteJob) for a in t.decision.actions)


def test_no_failure_is_no_decision() -> None:
    t = Transition(DiffusionJobStatus(phase=Phase.RUNNING), 1, NOW)
    assert failure.handle_failure(t, make_job().job(), job_view(), [pod(0), pod(1)]) is False
    assert t.decision.actions == [] and t.decision.events == []


def report(attempt: int = 0, done: int = 0, total: int = 4, last: str | None = None) -> RankReport:
    return RankReport(attempt=attempt, completed=done, skipped=0, failed=0, total=total, progress_time=last)


@pytest.mark.parametrize(
    ("timeout", "ranks", "expected"),
    [
        (None, {"rank-0": report(last=ago(999))}, None),
        (30, {"rank-0": report(last=ago(10))}, None),
        (30, {"rank-0": report(last=ago(45))}, 45),
        (30, {"rank-0": report(last=ago(5)), "rank-1": report(last=ago(40))}, 40),
        (30, {"rank-0": report(done=4, last=ago(500))}, None),  # done ranks are quiet by right
        (30, {"rank-0": report(attempt=1, last=ago(500))}, None),  # another attempt's report
        (30, {"rank-0": report(last=None)}, None),  # no first step yet: loading is not a stall
    ],
    ids=["off", "recent", "quiet", "quietest-rank", "done", "old-attempt", "not-started"],
)
def test_stall(timeout: int | None, ranks: dict[str, RankReport], expected: int | None) -> None:
    assert stall.stalled_seconds(RunPolicy(stall_timeout_seconds=timeout), ranks, 0, NOW) == expected
