"""Each lifecycle policy on its own, as tables of cases (lifecycle.decide composes them)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

import pytest
from muralist_api.job import ContextParallelSpec, Parallelism
from muralist_api.pods import RunPolicy
from muralist_api.status import MAX_INDEX_ENTRIES, DiffusionJobStatus, Phase
from muralist_operator.decision import (
    REASON_MAX_RESTARTS,
    REASON_PERMANENT,
    REASON_POD_FAILED,
    REASON_STALLED,
    DeleteJob,
    SetJobSuspend,
    Transition,
    iso,
)
from muralist_operator.observe import JobView, PodView, WarningEvent
from muralist_operator.policies import deadline, failure, stall, start, suspension, ttl, world
from muralist_operator.progress.snapshot import PostError

from tests.builders import make_job
from tests.views import NOW, failed, index_progress, job_view, pod, progress


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


PERMANENT = '{"permanent": true, "message": "spec.x: no"}'


def decide_failures(pods: list, max_restarts: int = 3, job=None, indexes=None):
    t = Transition(DiffusionJobStatus(phase=Phase.RUNNING, indexes=indexes or []), 1, NOW)
    decided = failure.handle(t, make_job().run_policy(maxRestarts=max_restarts).job(), job or job_view(), pods)
    return decided, t


# (pods, maxRestarts) -> (decided, phase, reason of the Failed condition, restarts, {index: failures})
FAILURE_CASES: dict[str, tuple[list, int, tuple[bool, Phase, str | None, int, dict[int, int]]]] = {
    "nothing failed": ([pod(0), pod(1)], 3, (False, Phase.RUNNING, None, 0, {})),
    "one pod failed: only its index is retried": (
        [pod(0), failed(1), pod(2)], 3, (False, Phase.RUNNING, None, 1, {1: 1})),
    "its retry is running: still one failure": (
        [pod(0), failed(1), pod(1, failures=1)], 3, (False, Phase.RUNNING, None, 1, {1: 1})),
    "the retry failed too": (
        [failed(1), failed(1, failures=1), pod(1, failures=2)], 3, (False, Phase.RUNNING, None, 2, {1: 2})),
    "two indexes, counted apart": (
        [failed(0), pod(0, failures=1), failed(3), pod(3, failures=1)], 3, (False, Phase.RUNNING, None, 2,
                                                                            {0: 1, 3: 1})),
    "an evicted pod is not counted": (
        [pod(0, "Failed", disrupted=True), pod(0)], 3, (False, Phase.RUNNING, None, 0, {})),
    "out of retries": (
        [failed(0), failed(0, failures=1)], 1, (True, Phase.FAILED, REASON_MAX_RESTARTS, 1, {0: 2})),
    "maxRestarts 0: the first failure fails the job": (
        [failed(0), pod(1)], 0, (True, Phase.FAILED, REASON_MAX_RESTARTS, 0, {0: 1})),
    "a permanent failure anywhere decides": (
        [failed(0), failed(1, message=PERMANENT)], 3, (True, Phase.FAILED, REASON_PERMANENT, 1, {0: 1, 1: 1})),
    "a permanent failure is not a retry": (
        [failed(0, message=PERMANENT)], 3, (True, Phase.FAILED, REASON_PERMANENT, 0, {0: 1})),
    "exit 78 is permanent whatever the message": (
        [failed(0, code=78, message="log tail")], 3, (True, Phase.FAILED, REASON_PERMANENT, 0, {0: 1})),
}


@pytest.mark.parametrize(("pods", "max_restarts", "expected"), FAILURE_CASES.values(), ids=FAILURE_CASES.keys())
def test_failure(pods: list, max_restarts: int, expected: tuple) -> None:
    decided, t = decide_failures(pods, max_restarts)
    reason = next((c.reason for c in t.status.conditions if c.type == "Failed"), None)
    by_index = {e.index: e.failures for e in t.status.indexes}
    assert (decided, t.status.phase, reason, t.status.restarts, by_index) == expected
    # The Job's own rules stop the pods (exit 78, maxFailedIndexes); the operator deletes
    # nothing, except for a permanent message behind another exit code.
    deletes = [a for a in t.decision.actions if isinstance(a, DeleteJob)]
    permanent_message = any(p.termination and p.termination.exit_code != 78 and p.termination.permanent
                            for p in pods)
    assert bool(deletes) == permanent_message


@pytest.mark.parametrize(
    ("job", "reason"),
    [
        (job_view(failed=True, failure_reason="PodFailurePolicy", failure_message="exit code 78"), REASON_PERMANENT),
        (job_view(failed=True, failure_reason="MaxFailedIndexesExceeded", failed_indexes="2"), REASON_MAX_RESTARTS),
        (job_view(failed=True, failure_reason="Whatever"), REASON_POD_FAILED),
    ],
    ids=["fail-job-rule", "max-failed-indexes", "other"],
)
def test_the_jobs_own_verdict_counts_before_the_pods_show_it(job, reason: str) -> None:
    decided, t = decide_failures([], job=job)
    assert decided and t.status.phase == Phase.FAILED
    assert [c.reason for c in t.status.conditions if c.type == "Failed"] == [reason]


def test_a_new_failure_is_recorded_once_with_its_reason_and_an_event() -> None:
    decided, t = decide_failures([pod(0), failed(1, message="rank 1: NCCL timeout")])
    assert not decided
    [entry] = t.status.indexes
    assert (entry.index, entry.failures, entry.last_failure_reason) == (1, 1, REASON_POD_FAILED)
    assert entry.last_failure == "pod cats-1-0: exit code 1: rank 1: NCCL timeout"
    assert [(e.type, e.reason) for e in t.decision.events] == [("Warning", REASON_POD_FAILED)]
    assert "index 1 (pod cats-1-0)" in t.decision.events[0].message and "(1/3)" in t.decision.events[0].message
    _, t2 = decide_failures([pod(0), failed(1), pod(1, failures=1)], indexes=t.status.indexes)
    assert t2.decision.events == [] and t2.status.indexes == t.status.indexes


def test_a_stalled_pod_says_so() -> None:
    _, t = decide_failures([failed(2, code=137, message="", stopped="Stalled: no progress for 90s")])
    [entry] = t.status.indexes
    assert (entry.last_failure_reason, entry.last_failure) == (REASON_STALLED, "pod cats-2-0: no progress for 90s")


def test_status_indexes_stay_bounded() -> None:
    pods = [failed(i) for i in range(MAX_INDEX_ENTRIES + 10)]
    _, t = decide_failures(pods, max_restarts=5)
    assert len(t.status.indexes) == MAX_INDEX_ENTRIES and t.status.restarts == MAX_INDEX_ENTRIES + 10


def prog(index: int = 0, quiet: float | None = None, finished: bool = False, pod_name: str | None = None,
         posted: float | None = 0):
    """`quiet`: seconds since the pod's last step; `posted`: since its last accepted post (by
    default it has just posted: the endpoint hears from it)."""
    return index_progress(index, done=1, last=None if quiet is None else NOW - timedelta(seconds=quiet),
                          finished=finished, pod_name=pod_name,
                          posted=None if posted is None else NOW - timedelta(seconds=posted))


@pytest.mark.parametrize(
    ("timeout", "indexes", "pods", "expected"),
    [
        (None, [prog(0, quiet=599)], [pod(0)], []),  # the default: at least the collective timeout
        (None, [prog(0, quiet=999)], [pod(0)], [("cats-0-0", 999)]),
        (30, [prog(0, quiet=10)], [pod(0)], []),
        (30, [prog(0, quiet=45)], [pod(0)], [("cats-0-0", 45)]),
        (30, [prog(0, quiet=40), prog(1, quiet=50), prog(2, quiet=5)], [pod(0), pod(1), pod(2)],
         [("cats-1-0", 50), ("cats-0-0", 40)]),
        (30, [prog(0, quiet=500, finished=True)], [pod(0)], []),  # done pods are quiet by right
        (30, [prog(0, quiet=500)], [pod(0, failures=1)], []),  # the report of a pod since replaced
        (30, [prog(0, quiet=500)], [pod(0, deleting=True)], []),  # already going
        (30, [prog(0, quiet=None)], [pod(0)], []),  # no first step yet: loading is not a stall
    ],
    ids=["default-recent", "default-quiet", "recent", "quiet", "only-the-quiet-ones", "done", "replaced", "deleting",
         "not-started"],
)
def test_stall(timeout: int | None, indexes: list, pods: list, expected: list) -> None:
    spec = make_job().run_policy(stallTimeoutSeconds=timeout).job().spec
    found = stall.stalled(spec, progress(*indexes), pods, NOW)
    assert [(s.pod.name, s.quiet) for s in found] == expected


@pytest.mark.parametrize(
    ("explicit", "collective", "gap", "expected"),
    [
        (None, 600, None, 600),  # nothing seen yet: the collective timeout
        (None, 600, 3.0, 600),  # a fast model (gaps of a post interval): the collective timeout
        (None, 600, 95.5, 955),  # minutes between steps: ten of the slowest gap
        (None, 10, 3.0, 30),  # a short collective timeout: the gaps decide
        (45, 600, 95.5, 45),  # an explicit value wins
        (10**6, 10, 3.0, 10**6),  # ...large ones too (there is no "off")
    ],
    ids=["unseen", "fast", "slow-steps", "short-collective", "explicit", "explicit-large"],
)
def test_stall_timeout(explicit: int | None, collective: int, gap: float | None, expected: int) -> None:
    spec = (make_job().run_policy(stallTimeoutSeconds=explicit)
            .set("spec.parallelism.collectiveTimeoutSeconds", collective).job().spec)
    pushed = dataclasses.replace(progress(prog(0, quiet=1)), slowest_gap_seconds=gap)
    assert stall.timeout(spec, pushed) == expected


def test_the_default_stall_says_where_it_comes_from() -> None:
    spec = make_job().job().spec
    [found] = stall.stalled(spec, progress(prog(0, quiet=700)), [pod(0)], NOW)
    assert (found.timeout, found.default) == (600, True)
    assert stall.message(found) == (
        "no progress for 700s (runPolicy.stallTimeoutSeconds unset: the default, 600s, is 10x the job's slowest gap "
        "between steps, at least parallelism.collectiveTimeoutSeconds)")


def test_the_next_stall_check_is_when_the_quietest_pod_could_be_over() -> None:
    spec = make_job().run_policy(stallTimeoutSeconds=60).job().spec
    pushed = progress(prog(0, quiet=50), prog(1, quiet=10), prog(2, quiet=500, finished=True), prog(3, quiet=None),
                      prog(4, quiet=900))
    pods = [pod(0), pod(1), pod(2), pod(3), pod(4, deleting=True)]
    assert stall.next_check(spec, pushed, pods, NOW) == NOW + timedelta(seconds=11)
    # Nobody has stepped yet: only when the posts could fall silent for the timeout.
    assert stall.next_check(spec, progress(prog(0, quiet=None)), [pod(0)], NOW) == NOW + timedelta(seconds=61)
    assert stall.next_check(spec, progress(prog(0, quiet=None, posted=None)), [pod(0)], NOW) is None
    # Overdue (stalled now): the next check is the silence's.
    assert stall.stalled(spec, progress(prog(0, quiet=90)), [pod(0)], NOW)
    assert stall.next_check(spec, progress(prog(0, quiet=90)), [pod(0)], NOW) == NOW + timedelta(seconds=61)


REFUSED = PostError(NOW - timedelta(seconds=3), 401, "token refused: invalid bearer token")


@pytest.mark.parametrize(
    ("indexes", "pods", "refused", "silent_since", "stalled"),
    [
        # Every pod's posts stopped: the endpoint, not the pods; nothing is stalled.
        ([prog(0, quiet=100, posted=100), prog(1, quiet=95, posted=90)], [pod(0), pod(1)], None, 90, []),
        # A pod that keeps posting without stepping is the stall case.
        ([prog(0, quiet=100, posted=2), prog(1, quiet=5, posted=2)], [pod(0), pod(1)], None, None, ["cats-0-0"]),
        # One pod silent while another posts: the endpoint is reachable, so that pod is stalled.
        ([prog(0, quiet=100, posted=100), prog(1, quiet=5, posted=3)], [pod(0), pod(1)], None, None, ["cats-0-0"]),
        # Posts arrive but are refused: silent since the last accepted one.
        ([prog(0, quiet=100, posted=100)], [pod(0)], 97, 100, []),
        # ...and with none accepted from the pods running now (new since a resume), since the first refusal.
        ([prog(0, quiet=500, posted=500)], [pod(0, failures=1)], 40, 40, []),
        ([prog(0, quiet=500, posted=500)], [pod(0, failures=1)], 20, None, []),
        # Pods new since the last post and not posting yet (loading, after a resume): no verdict.
        ([prog(0, quiet=500, posted=500)], [pod(0, failures=1)], None, None, []),
        # Nothing posted since this operator started: no verdict (and no step to time).
        ([], [pod(0)], None, None, []),
        ([prog(0, quiet=None, posted=None)], [pod(0)], None, None, []),
        # Pods that said their work is done are quiet by right; no pod running: nothing waits for posts.
        ([prog(0, quiet=100, posted=100, finished=True)], [pod(0)], None, None, []),
        ([prog(0, quiet=100, posted=100)], [pod(0, "Pending")], None, None, []),
        ([prog(0, quiet=100, posted=100)], [pod(0, deleting=True)], None, None, []),
        # Within the timeout.
        ([prog(0, quiet=25, posted=25)], [pod(0)], None, None, []),
        # Past the timeout without a step, but no post since it passed: posts may have stopped (a
        # pod posts its step a few seconds late): neither verdict yet, the next post decides.
        ([prog(0, quiet=35, posted=28)], [pod(0)], None, None, []),
    ],
    ids=["all-silent", "posts-without-stepping", "one-silent-among-posting", "refused", "refused-new-pods",
         "refused-not-long", "new-pods-not-posting", "never-heard", "loading", "done", "not-running", "deleting",
         "recent", "over-but-no-post-since"],
)
def test_silence_is_not_a_stall(indexes: list, pods: list, refused: float | None, silent_since: float | None,
                                stalled: list[str]) -> None:
    spec = make_job().run_policy(stallTimeoutSeconds=30).job().spec
    pushed = progress(*indexes, refused_since=None if refused is None else NOW - timedelta(seconds=refused),
                      last_error=REFUSED if refused is not None else None)
    found = stall.unreachable(spec, pushed, pods, NOW)
    assert (found.since if found else None) == (None if silent_since is None else NOW - timedelta(seconds=silent_since))
    assert [s.pod.name for s in stall.stalled(spec, pushed, pods, NOW)] == stalled
    if found is not None:
        assert (found.timeout, found.default, found.running) == (30, False, len(pods))
        assert found.last_error == (REFUSED if refused is not None else None)
        assert stall.next_check(spec, pushed, pods, NOW) is None, "the next accepted post wakes the job"


def test_a_quiet_pod_waits_for_the_next_post_to_be_called_stalled() -> None:
    spec = make_job().run_policy(stallTimeoutSeconds=30).job().spec
    before = progress(prog(0, quiet=35, posted=28))
    assert stall.awaits_post(spec, before, [pod(0)], NOW) and not stall.stalled(spec, before, [pod(0)], NOW)
    assert stall.next_check(spec, before, [pod(0)], NOW) == NOW + timedelta(seconds=3), "or silent for the timeout"
    after = progress(prog(0, quiet=36, posted=0))  # it posts, without a step
    assert [s.pod.name for s in stall.stalled(spec, after, [pod(0)], NOW)] == ["cats-0-0"]
    assert not stall.awaits_post(spec, progress(prog(0, quiet=5, posted=0)), [pod(0)], NOW)
    silent = progress(prog(0, quiet=100, posted=90))
    assert stall.awaits_post(spec, silent, [pod(0)], NOW), "its next post clears ProgressUnreachable"


def test_after_a_break_in_the_posts_each_pod_gets_the_timeout_to_be_heard_again() -> None:
    # The endpoint comes back: pod 0's first post arrives before pod 1's, whose last step is old.
    spec = make_job().run_policy(stallTimeoutSeconds=30).job().spec
    pods = [pod(0), pod(1)]
    back = progress(prog(0, quiet=0, posted=0), prog(1, quiet=100, posted=100), reachable_since=NOW)
    assert stall.stalled(spec, back, pods, NOW) == [] and stall.unreachable(spec, back, pods, NOW) is None
    assert stall.next_check(spec, back, pods, NOW) == NOW + timedelta(seconds=31)
    # The timeout later pod 1 has still not stepped, while pod 0 posts on: stalled.
    later = NOW + timedelta(seconds=31)
    still = progress(prog(0, quiet=-31, posted=-31), prog(1, quiet=100, posted=100), reachable_since=NOW)
    assert [(s.pod.name, s.quiet) for s in stall.stalled(spec, still, pods, later)] == [("cats-1-0", 131)]


def test_the_next_check_is_also_when_the_posts_could_fall_silent() -> None:
    spec = make_job().run_policy(stallTimeoutSeconds=30).job().spec
    posting = progress(prog(0, quiet=None, posted=10))  # loading, posting: no step to time
    assert stall.next_check(spec, posting, [pod(0)], NOW) == NOW + timedelta(seconds=21)
    stepping = progress(prog(0, quiet=25, posted=10))
    assert stall.next_check(spec, stepping, [pod(0)], NOW) == NOW + timedelta(seconds=6)


def test_progress_unreachable_is_a_condition_an_event_and_a_note_never_a_deletion() -> None:
    spec = make_job().run_policy(stallTimeoutSeconds=30).job().spec
    silent = progress(prog(0, quiet=100, posted=100), prog(1, quiet=95, posted=90), refused_since=NOW - timedelta(
        seconds=88), last_error=REFUSED)
    found = stall.unreachable(spec, silent, [pod(0), pod(1)], NOW)
    assert found is not None
    t = Transition(DiffusionJobStatus(phase=Phase.RUNNING), 1, NOW)
    note = stall.reachability(t, found)
    since = iso(NOW - timedelta(seconds=90))
    assert note == (f"; progress unreachable: no post accepted since {since}; last refused: 401 token refused: "
                    "invalid bearer token")
    [condition] = t.status.conditions
    assert (condition.type, condition.status, condition.reason) == (
        "ProgressUnreachable", "True", "ProgressUnreachable")
    assert condition.message == (
        f"no progress post of this job's 2 running pod(s) has been accepted since {since}, longer than "
        "runPolicy.stallTimeoutSeconds=30s; its pods are not deleted while their posts do not arrive; the last post "
        "the progress endpoint refused for this job: 401 token refused: invalid bearer token")
    assert [(e.type, e.reason, e.message) for e in t.decision.events] == [
        ("Warning", "ProgressUnreachable", condition.message)]
    assert t.decision.actions == []
    # Decided again later: the same condition, no second event (and no status write: nothing changed).
    later = Transition(t.status, 1, NOW + timedelta(seconds=60))
    stall.reachability(later, stall.unreachable(spec, silent, [pod(0), pod(1)], NOW + timedelta(seconds=60)))
    assert later.status.conditions == t.status.conditions and later.decision.events == []
    # Posts accepted again: cleared, with a Normal event.
    back = Transition(later.status, 1, NOW + timedelta(seconds=61))
    assert stall.reachability(back, None) == ""
    [cleared] = back.status.conditions
    assert (cleared.status, cleared.reason) == ("False", "ProgressReceived")
    assert [(e.type, e.reason) for e in back.decision.events] == [("Normal", "ProgressReceived")]
    # Without a verdict ever: nothing at all.
    never = Transition(DiffusionJobStatus(), 1, NOW)
    assert stall.reachability(never, None) == "" and never.status.conditions == [] and never.decision.events == []
    nothing_heard = stall.unreachable(spec, progress(prog(0, quiet=100, posted=None)), [pod(0)], NOW)
    assert nothing_heard is None
    silent_unrefused = dataclasses.replace(found, last_error=None)
    assert "no post of the job reached the progress endpoint since (check NetworkPolicies" in \
        stall.unreachable_message(silent_unrefused)


@pytest.mark.parametrize(
    ("policy", "started", "finished", "deadline_due", "ttl_due"),
    [
        ({}, 30, None, None, None),
        ({"activeDeadlineSeconds": 100}, None, None, None, None),  # not started: nothing to count yet
        ({"activeDeadlineSeconds": 100}, 30, None, 70, None),
        ({"ttlSecondsAfterFinished": 60}, 30, None, None, None),  # not finished
        ({"ttlSecondsAfterFinished": 60}, 30, 10, None, 50),
        ({"ttlSecondsAfterFinished": 0}, 30, 10, None, -10),  # overdue: now
    ],
)
def test_when_the_deadline_and_the_ttl_are_due(policy: dict[str, int], started: int | None, finished: int | None,
                                               deadline_due: int | None, ttl_due: int | None) -> None:
    run_policy = make_job().run_policy(**policy).job().spec.run_policy
    st = DiffusionJobStatus(start_time=ago(started) if started is not None else None,
                            completion_time=ago(finished) if finished is not None else None)
    def in_(seconds: int | None) -> datetime | None:
        return None if seconds is None else NOW + timedelta(seconds=seconds)

    assert (deadline.due(st, run_policy), ttl.due(st, run_policy)) == (in_(deadline_due), in_(ttl_due))


def spanning(nodes: int = 4, ppn: int = 2, degree: int = 4) -> Parallelism:
    """A context-parallel group of `degree` ranks over pods of `ppn` (built past the admission
    rule that still keeps groups inside a pod)."""
    par = make_job().world(nodes=nodes, gpus=ppn).job().spec.parallelism
    return par.model_copy(update={"strategy": "ContextParallel",
                                  "context_parallel": ContextParallelSpec(ulysses_degree=degree)})


FAILED_AT = ago(10)


@pytest.mark.parametrize(
    ("par", "pods", "expected"),
    [
        (make_job().world(nodes=4).job().spec.parallelism,
         [pod(0), failed(1, finished=FAILED_AT), pod(2), pod(3)], []),  # worlds of one pod: never
        (spanning(), [pod(0), failed(1, finished=FAILED_AT), pod(2), pod(3)], [("cats-0-0", 1)]),
        (spanning(), [failed(0, finished=FAILED_AT), pod(1), pod(2), pod(3)], [("cats-1-0", 0)]),
        # A failure the operator caused is not passed on (or the worlds would stop each other).
        (spanning(), [pod(0), failed(1, finished=FAILED_AT, stopped="WorldPeerFailed: index 0 failed")], []),
        # The world is starting again: its new pods are not stopped.
        (spanning(), [failed(0, finished=FAILED_AT), pod(1, created=ago(1))], []),
        (spanning(), [failed(0, finished=FAILED_AT), pod(1, "Succeeded")], []),
        (spanning(), [failed(0, finished=FAILED_AT), pod(1, deleting=True)], []),
        # Its retry replaced the failed pod: nothing left to pass on.
        (spanning(), [failed(0, finished=FAILED_AT), pod(0, failures=1), pod(1)], []),
    ],
    ids=["one-pod-worlds", "peer-of-1", "peer-of-0", "caused-by-us", "new-peer", "peer-done", "peer-going",
         "retried"],
)
def test_a_world_spanning_pods_starts_again_together(par: Parallelism, pods: list, expected: list) -> None:
    assert [(s.pod.name, s.failed.index) for s in world.peers_to_stop(par, pods)] == expected


# -- pods that never start (policies.start)

def pending(index: int = 0, reason: str = "", message: str = "", age: float = 5, **fields: Any) -> PodView:
    """A pod of `index` created `age` seconds ago that has not started."""
    return pod(index, "Pending", waiting_reason=reason, waiting_message=message, created=ago(age), **fields)


PULL = ("ImagePullBackOff", 'Back-off pulling image "registry.example/muralist:nope"')
UNSCHEDULABLE = ("Unschedulable", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([pod(0), pod(1)], []),  # running: started
        ([pending(0, *PULL), pod(1)], [(0, "cats-0-0", "ImagePullBackOff")]),  # a problem: named at once
        ([pending(0, *UNSCHEDULABLE, age=1)], [(0, "cats-0-0", "Unschedulable")]),
        ([pending(0, age=5, scheduled=True)], []),  # merely slow, and not for long
        ([pending(0, age=45, scheduled=True)], [(0, "cats-0-0", "ContainerCreating")]),
        ([pending(0, age=45)], [(0, "cats-0-0", "Pending")]),  # no node, no verdict yet
        ([pending(0, *PULL, gated=True)], []),  # behind a scheduling gate: Kueue's to admit
        ([pending(0, *PULL, deleting=True)], []),
        # The slow one after the one with a problem, whichever waited longer.
        ([pending(0, age=300, scheduled=True), pending(1, *PULL, age=10)],
         [(1, "cats-1-0", "ImagePullBackOff"), (0, "cats-0-0", "ContainerCreating")]),
        # A retried index: its failed pod stays; its new pod has not started.
        ([failed(0), pending(0, *PULL, failures=1)], [(0, "cats-0-1", "ImagePullBackOff")]),
    ],
    ids=["running", "image-pull", "unschedulable", "slow-briefly", "creating", "not-scheduled", "gated", "deleting",
         "problem-first", "retried"],
)
def test_pods_that_have_not_started_are_named(pods: list[PodView], expected: list) -> None:
    found = start.waiting(pods, job_view(), {}, {}, NOW)
    assert [(w.index, w.pod, w.reason) for w in start.named(found, NOW)] == expected


@pytest.mark.parametrize(
    "current",
    [job_view(suspended=True), job_view(deleting=True), job_view(complete=True), job_view(failed=True), None],
    ids=["suspended", "deleting", "complete", "failed", "no-job"],
)
def test_nothing_waits_to_start_when_the_job_runs_no_pods(current: JobView | None) -> None:
    assert start.waiting([pending(0, *PULL, age=9999)], current, {}, {}, NOW) == []


def test_a_volume_that_cannot_be_mounted_is_named_by_the_pods_event() -> None:
    # FailedMount leaves the pod ContainerCreating: only the kubelet's event says why.
    slow = pending(0, age=45, scheduled=True)
    found = start.waiting([slow], job_view(), {}, {}, NOW)
    assert start.event_subjects(found, NOW) == ["uid-0-0"]
    event = WarningEvent("FailedMount", 'MountVolume.SetUp failed for volume "prompts" : configmap "prompt-list" '
                         "not found", NOW)
    [named] = start.named(start.waiting([slow], job_view(), {"uid-0-0": event}, {}, NOW), NOW)
    assert (named.reason, named.problem) == ("FailedMount", True)
    assert named.describe() == ('index 0 (pod cats-0-0): FailedMount: MountVolume.SetUp failed for volume "prompts" '
                                ': configmap "prompt-list" not found')
    assert start.event_subjects(start.waiting([pending(0, *PULL)], job_view(), {}, {}, NOW), NOW) == [], \
        "a reason of its own: no events read"


def test_an_index_the_job_could_not_create_is_named_by_the_jobs_event() -> None:
    current = job_view(completions=2, uid="job-uid")
    rejected = WarningEvent("FailedCreate", 'Error creating: pods "cats-1-x" is forbidden: violates PodSecurity '
                            '"restricted:latest"', NOW - timedelta(seconds=5))
    clocks = {start.index_clock("job-uid", 1): NOW - timedelta(seconds=40)}
    assert start.missing_indexes(current, [pod(0)]) == [1]
    [quiet] = start.waiting([pod(0)], current, {}, clocks, NOW)
    assert (quiet.reason, quiet.uid, quiet.problem) == (start.NOT_CREATED, "job-uid", False)
    assert start.event_subjects([quiet], NOW) == ["job-uid"]
    [named] = start.named(start.waiting([pod(0)], current, {"job-uid": rejected}, clocks, NOW), NOW)
    assert (named.index, named.pod, named.reason) == (1, "", "FailedCreate")
    assert named.describe().startswith('index 1: FailedCreate: Error creating: pods "cats-1-x" is forbidden')
    stale = dataclasses.replace(rejected, time=NOW - timedelta(seconds=start.EVENT_FRESH_SECONDS + 1))
    assert start.waiting([pod(0)], current, {"job-uid": stale}, clocks, NOW)[0].reason == start.NOT_CREATED, \
        "an event about an earlier attempt says nothing about now"
    assert start.missing_indexes(job_view(completions=2, start_time=None), []) == [], "the Job has not started"


TIMEOUT = make_job().run_policy(startTimeoutSeconds=120).job().spec.run_policy
DEFAULT = make_job().job().spec.run_policy


@pytest.mark.parametrize(
    ("policy", "pods", "clocks", "expected"),
    [
        (TIMEOUT, [pending(0, *PULL, age=119)], {}, None),
        (TIMEOUT, [pending(0, *PULL, age=120)], {}, "cats-0-0"),
        (TIMEOUT, [pending(0, age=200, scheduled=True)], {}, "cats-0-0"),  # slow counts too
        (TIMEOUT, [pending(0, *PULL, age=130), pending(1, *UNSCHEDULABLE, age=500)], {}, "cats-1-0"),  # longest
        (DEFAULT, [pending(0, *PULL, age=599)], {}, None),
        (DEFAULT, [pending(0, *PULL, age=600)], {}, "cats-0-0"),
        # A retried pod has its own clock: its index failing an hour ago does not count.
        (TIMEOUT, [failed(0, created=ago(3600)), pending(0, *PULL, failures=1, age=30)], {}, None),
        # Its gate was lifted 30 s ago: created long before, it waited behind the gate, not to start.
        (TIMEOUT, [pending(0, *UNSCHEDULABLE, age=3600)], {"uid-0-0": NOW - timedelta(seconds=30)}, None),
        (TIMEOUT, [pending(0, *PULL, age=9999, gated=True)], {}, None),
    ],
    ids=["under", "at", "slow", "longest-first", "default-under", "default-at", "retried", "gate-lifted", "gated"],
)
def test_start_timeout(policy: RunPolicy, pods: list[PodView], clocks: dict, expected: str | None) -> None:
    late = start.timed_out(start.waiting(pods, job_view(), {}, clocks, NOW), policy, NOW)
    assert (late.pod if late is not None else None) == expected


def test_an_index_without_a_pod_is_timed_only_when_the_job_says_why() -> None:
    # Without an event it is the Job controller's backoff (or the controller away): not the job's fault.
    current = job_view(completions=1, uid="job-uid")
    clocks = {start.index_clock("job-uid", 0): NOW - timedelta(seconds=900)}
    quiet = start.waiting([], current, {}, clocks, NOW)
    assert start.timed_out(quiet, TIMEOUT, NOW) is None
    rejected = {"job-uid": WarningEvent("FailedCreate", "forbidden", NOW)}
    late = start.timed_out(start.waiting([], current, rejected, clocks, NOW), TIMEOUT, NOW)
    assert late is not None and start.timeout_message(late, TIMEOUT, NOW) == (
        "index 0: FailedCreate: forbidden; not started after 900s (runPolicy.startTimeoutSeconds=120)")


def test_the_timeout_says_where_it_comes_from() -> None:
    late = start.timed_out(start.waiting([pending(0, *PULL, age=700)], job_view(), {}, {}, NOW), DEFAULT, NOW)
    assert late is not None and start.timeout_message(late, DEFAULT, NOW) == (
        'index 0 (pod cats-0-0): ImagePullBackOff: Back-off pulling image "registry.example/muralist:nope"; not '
        "started after 700s (runPolicy.startTimeoutSeconds unset: the default, 600s)")


def test_the_next_start_check_is_the_earliest_notice_or_timeout() -> None:
    def due(*pods: PodView) -> datetime | None:
        return start.next_check(start.waiting(list(pods), job_view(), {}, {}, NOW), TIMEOUT, NOW)

    assert due(pod(0)) is None, "nothing waits"
    assert due(pending(0, *PULL, age=100)) == NOW + timedelta(seconds=21), "named already: its timeout"
    assert due(pending(0, age=10, scheduled=True)) == NOW + timedelta(seconds=20), "slow: when it is to be named"
    assert due(pending(0, age=40, scheduled=True)) == NOW + timedelta(seconds=start.EVENTS_AGAIN_SECONDS), \
        "named, reason unknown: its events again"
    assert due(pending(0, *PULL, age=500)) == NOW, "overdue: now"


def test_the_condition_names_the_waiting_pods_and_goes_when_they_start() -> None:
    t = Transition(DiffusionJobStatus(), 1, NOW)
    found = start.waiting([pending(0, *PULL), pending(1, *UNSCHEDULABLE)], job_view(), {}, {}, NOW)
    first = start.apply(t, TIMEOUT, found, NOW)
    assert first is not None and first.index == 0
    [condition] = t.status.conditions
    assert (condition.type, condition.status, condition.reason) == ("PodsNotStarting", "True", "ImagePullBackOff")
    assert condition.message == ('index 0 (pod cats-0-0): ImagePullBackOff: Back-off pulling image '
                                 '"registry.example/muralist:nope"; index 1 (pod cats-1-0): Unschedulable: 0/2 nodes '
                                 "are available: 2 Insufficient nvidia.com/gpu.")
    assert t.decision.actions == [] and t.status.phase == Phase.PENDING
    later = Transition(t.status, 1, NOW)
    assert start.apply(later, TIMEOUT, start.waiting([pod(0), pod(1)], job_view(), {}, {}, NOW), NOW) is None
    assert later.status.conditions == []


def test_past_the_start_timeout_the_job_fails_with_the_pods_reason() -> None:
    t = Transition(DiffusionJobStatus(), 1, NOW)
    start.apply(t, TIMEOUT, start.waiting([pending(0, *UNSCHEDULABLE, age=121)], job_view(), {}, {}, NOW), NOW)
    assert t.status.phase == Phase.FAILED and t.decision.actions == [DeleteJob("Unschedulable")]
    failed_condition = next(c for c in t.status.conditions if c.type == "Failed")
    assert failed_condition.reason == "Unschedulable"
    assert failed_condition.message.startswith("index 0 (pod cats-0-0): Unschedulable: 0/2 nodes are available")
    assert failed_condition.message.endswith("not started after 121s (runPolicy.startTimeoutSeconds=120)")


# -- cost: GPU-seconds per item, and the cost at a price per GPU-hour


def cost_status(gpu_seconds: float = 0, running: int = 0, at: datetime | None = None, completed: int = 0,
                kept: int = 0, total: int = 0, failed_items: int = 0) -> DiffusionJobStatus:
    from muralist_api.status import Cost, Progress

    status = DiffusionJobStatus(progress=Progress(completed=completed, kept=kept, total=total, failed=failed_items))
    if at is not None or gpu_seconds:
        status.cost = Cost(gpu_seconds=gpu_seconds, running_gpus=running, accounted_at=at.isoformat() if at else None)
    return status


@pytest.mark.parametrize(
    ("before", "pods", "gpus", "price", "after"),
    [
        # Nothing ran yet: no cost at all.
        (cost_status(), 0, 4, None, None),
        # Two pods of 4 GPUs start: counted from now on.
        (cost_status(), 2, 4, None, {"gpuSeconds": 0, "runningGpus": 8, "gpuSecondsPerItem": None}),
        # 8 GPUs for 100 s more; 10 items rendered (2 of the 12 were kept from before and cost nothing).
        (cost_status(1000, 8, NOW - timedelta(seconds=100), completed=12, kept=2, total=40), 2, 4, None,
         {"gpuSeconds": 1800, "runningGpus": 8, "gpuSecondsPerItem": 180, "costSoFar": None}),
        # At 3.6 per GPU-hour: 1800 GPU-s cost 1.8; 28 items left at 180 GPU-s each cost 5.04.
        (cost_status(1000, 8, NOW - timedelta(seconds=100), completed=12, kept=2, total=40), 2, 4, 3.6,
         {"gpuSeconds": 1800, "costSoFar": 1.8, "estimatedCostToFinish": 5.04, "pricePerGpuHour": 3.6}),
        # The job ended: the last interval counted, nothing runs any more.
        (cost_status(100, 4, NOW - timedelta(seconds=10), completed=10, total=10), 0, 4, 1.0,
         {"gpuSeconds": 140, "runningGpus": 0, "gpuSecondsPerItem": 14, "estimatedCostToFinish": 0}),
        # A job without GPUs counts its processes.
        (cost_status(), 1, 0, None, {"runningGpus": 2}),
    ],
)
def test_cost(before: DiffusionJobStatus, pods: int, gpus: int, price: float | None, after: dict | None) -> None:
    from muralist_operator.policies import cost

    job = make_job().world(gpus=gpus, processes=None if gpus else 2).job()
    cost.account(before, job, pods, price, NOW)
    if after is None:
        assert before.cost is None
        return
    assert before.cost is not None
    wire = before.cost.model_dump(by_alias=True)
    assert {k: wire[k] for k in after} == after
    assert wire["accountedAt"] == NOW.isoformat(timespec="seconds")


@pytest.mark.parametrize(("annotation", "default", "expected"), [
    (None, None, None), (None, 2.5, 2.5), ("1.25", 2.5, 1.25), ("free", 2.5, 2.5), ("-1", None, None)])
def test_the_price_per_gpu_hour(annotation: str | None, default: float | None, expected: float | None) -> None:
    from muralist_operator.policies import cost

    job = make_job().job()
    if annotation is not None:
        job = make_job().set("metadata.annotations", {cost.PRICE_ANNOTATION: annotation}).job()
    assert cost.price(job, default) == expected
