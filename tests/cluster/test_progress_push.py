"""Pushed progress end to end through the operator under test: its HTTPS endpoint, TokenReview,
the pod check against its kopf index, the aggregator, the status it writes, and stall detection
from the reports. Each pod's posts are made here as the runtime's poster makes them, with the
URL, CA and token the pod is given (tests/progress_poster.py; tests/cluster/test_pod_e2e.py runs
the real runtime)."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from muralist_api import contract

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for
from tests.operator_helpers import DJ, pod_index
from tests.progress_poster import Blocked, Poster

pytestmark = pytest.mark.cluster


def running(name: str, nodes: int, **policy: Any) -> dict[str, Any]:
    job = make_job(name).prompts(*[f"prompt {i}" for i in range(10)]).world(nodes=nodes, gpus=1)
    return job.run_policy(**policy).pod_template(annotations=fate_annotations("run")).obj()


def test_posts_become_status_with_percent_rate_and_eta(dj: DJ) -> None:
    dj.create(running("cats", nodes=2))
    pods = dj.wait_pods("cats", 2)
    posters = [Poster(dj, p) for p in pods]
    assert posters[0].url.endswith(f"/v1/namespaces/{dj.ns}/diffusionjobs/cats/progress")
    for p in posters:
        assert wait_for(lambda p=p: p.post(1, 10)[0] == 204, timeout=30, message="the first post accepted")
    wait_for(lambda: dj.status("cats")["progress"]["completed"] == 2, timeout=15, message="2 images in status")
    for completed in (2, 3):
        for p in posters:
            assert p.post(completed, 10)[0] == 204
    status = wait_for(lambda: (s := dj.status("cats"))["progress"]["completed"] == 6 and s, timeout=15,
                      message="6 images in status")
    progress = status["progress"]
    assert (progress["summary"], progress["total"], progress["percent"]) == ("6/10", 10, 60.0)
    assert progress["imagesPerSecond"] > 0 and progress["estimatedSecondsRemaining"] > 0 and progress["eta"]
    assert status["phase"] == "Running"


def test_a_token_of_another_job_another_audience_or_none_is_refused(dj: DJ, operator: Any) -> None:
    dj.create(running("cats", nodes=1))
    dj.create(running("dogs", nodes=1))
    cat, dog = dj.wait_pods("cats", 1)[0], dj.wait_pods("dogs", 1)[0]
    ok = Poster(dj, cat)
    assert wait_for(lambda: ok.post(1, 10)[0] == 204, timeout=30, message="the job's own pod accepted")
    intruder = Poster(dj, cat, as_pod=dog)  # a pod of dogs posting to cats
    status, body = intruder.post(5, 10)
    assert status == 403 and "is not a pod of diffusionjob cats" in body["error"]
    status, body = Poster(dj, cat, audience="https://kubernetes.default.svc").post(5, 10)
    assert status == 401
    assert ok.post(5, 10, token=None) == (401, {"error": "no bearer token"})
    wait_for(lambda: "refused a progress post" in operator.logs(), timeout=10, message="the refusal logged")
    assert dj.status("cats")["progress"]["completed"] <= 1  # nothing of theirs was counted


def test_a_pod_that_stops_stepping_is_retried_alone(dj: DJ) -> None:
    dj.create(running("stall", nodes=3, stallTimeoutSeconds=10))
    pods = {pod_index(p): p for p in dj.wait_pods("stall", 3)}
    posters = {i: Poster(dj, p) for i, p in pods.items()}
    long_ago = datetime.now(UTC) - timedelta(seconds=60)
    # Pod 0 is still loading (its clock starts at its first step), pod 1 last stepped a minute
    # ago, pod 2 says its work is done (quiet by right).
    for i, p in posters.items():
        assert wait_for(lambda p=p, i=i: p.post(0 if i == 0 else 1, 10, step=long_ago, done=i == 2,
                                                loading=i == 0)[0] == 204, timeout=30, message="first posts")
    retried = wait_for(lambda: (s := dj.status("stall")).get("restarts") == 1 and s, timeout=60,
                       message="the stalled pod retried")
    assert [(e["index"], e["lastFailureReason"]) for e in retried["indexes"]] == [(1, "Stalled")]
    assert "no progress for" in retried["indexes"][0]["lastFailure"] and retried["phase"] == "Running"
    dj.wait_events("stall", "Stalled")
    again = wait_for(lambda: next((p for p in dj.pods("stall", index=1) if p.status.phase == "Running"
                                   and p.metadata.uid != pods[1].metadata.uid), None), timeout=60,
                     message="a new pod for index 1")
    assert again.metadata.annotations[contract.INDEX_FAILURE_COUNT_ANNOTATION] == "1"
    for i in (0, 2):  # the others were left alone
        assert [p.metadata.uid for p in dj.pods("stall", index=i)] == [pods[i].metadata.uid]
    for p in dj.pods("stall"):
        set_pod_fate(dj.core, p.metadata.name, dj.ns, "succeed", after="100ms")
    done = dj.wait_phase("stall", "Succeeded")
    assert done["restarts"] == 1 and done["progress"]["summary"] == "10/10"


class Posting:
    """The pods' posters at work: each posts every second, as the runtime does (every few), until
    stopped; `step(i)` says whether pod i's ranks step (else its last step stays where it was)."""

    def __init__(self, posters: dict[int, Poster], token: Callable[[int], str | None] = lambda i: "mine") -> None:
        self.posters, self.token = posters, token
        self.stepping: dict[int, bool] = dict.fromkeys(posters, True)
        self.last_step = {i: datetime.now(UTC) for i in posters}
        self.answers: dict[int, int | str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.completed = 1

    def __enter__(self) -> Posting:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.completed = min(self.completed + 1, 9)
            for i, poster in self.posters.items():
                if self.stepping[i]:
                    self.last_step[i] = datetime.now(UTC)
                try:
                    self.answers[i] = poster.post(self.completed if self.stepping[i] else 1, 10,
                                                  step=self.last_step[i], token=self.token(i))[0]
                except Blocked:
                    self.answers[i] = "blocked"
                except OSError as e:
                    self.answers[i] = repr(e)
            self._stop.wait(1.0)


NFS_OUTPUT = {"volume": {"nfs": {"server": "nfs.example", "path": "/results"}}}


def unreachable(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == "ProgressUnreachable"), None)


def test_progress_posts_blocked_by_a_network_policy_give_progress_unreachable_and_no_pod_is_deleted(
        dj: DJ, control_plane: Any) -> None:
    job = running("quiet", nodes=2, stallTimeoutSeconds=10)
    job["spec"]["output"] = NFS_OUTPUT  # shared by the pods, and kwok runs them (it mounts nothing)
    dj.create(job)
    pods = {pod_index(p): p for p in dj.wait_pods("quiet", 2)}
    posters = {i: Poster(dj, p) for i, p in pods.items()}
    for p in posters.values():
        assert wait_for(lambda p=p: p.post(1, 10)[0] == 204, timeout=30, message="the first post accepted")
    networking = client.NetworkingV1Api(dj.core.api_client)
    wrong_audience = {i: p.token_for("https://kubernetes.default.svc", pods[i]) for i, p in posters.items()}
    tokens: dict[int, str | None] = dict.fromkeys(posters, "mine")
    with Posting(posters, token=lambda i: tokens[i]) as posting:
        wait_for(lambda: dj.status("quiet")["progress"]["completed"] >= 4, timeout=30, message="posts counted")
        # A NetworkPolicy of the namespace denies the job's pods every egress: their posts stop.
        networking.create_namespaced_network_policy(dj.ns, {
            "metadata": {"name": "no-egress"},
            "spec": {"podSelector": {"matchLabels": {"muralist.dev/job-name": "quiet"}}, "policyTypes": ["Egress"]}})
        wait_for(lambda: set(posting.answers.values()) == {"blocked"}, timeout=10, message="posts blocked")
        silent = wait_for(lambda: (s := dj.status("quiet")) and (c := unreachable(s)) and c["status"] == "True" and s,
                          timeout=60, message="ProgressUnreachable")
        condition = unreachable(silent)
        assert condition is not None and "no post of the job reached the progress endpoint" in condition["message"]
        assert "check NetworkPolicies" in condition["message"]
        assert silent["phase"] == "Running" and silent.get("restarts", 0) == 0
        assert "progress unreachable: no post accepted since" in silent["message"]
        dj.wait_events("quiet", "ProgressUnreachable")
        # kubectl shows it where it shows reasons (the message column).
        wide = subprocess.run([str(control_plane.bin_dir / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig),
                               "-n", dj.ns, "get", "dj", "quiet", "-o", "wide"],
                              capture_output=True, text=True, check=True, timeout=30).stdout
        assert "progress unreachable" in wide

        # The policy goes, but the pods' tokens are now refused (a token projection for another
        # audience): the posts arrive and are refused, and the condition names the error.
        tokens.update(wrong_audience)
        networking.delete_namespaced_network_policy("no-egress", dj.ns)
        refused = wait_for(lambda: (c := unreachable(dj.status("quiet"))) and "401 token" in c["message"] and c,
                           timeout=30, message="the refusal in the condition")
        assert refused["status"] == "True" and "the last post the progress endpoint refused" in refused["message"]
        wait_for(lambda: set(posting.answers.values()) == {401}, timeout=10, message="every post refused")

        # Accepted again: the condition clears; nothing was deleted all along.
        tokens.update(dict.fromkeys(posters, "mine"))
        cleared = wait_for(lambda: (c := unreachable(dj.status("quiet"))) and c["status"] == "False" and c,
                           timeout=30, message="ProgressUnreachable cleared")
        assert cleared["reason"] == "ProgressReceived"
    dj.wait_events("quiet", "ProgressReceived")
    after = dj.status("quiet")
    assert after["phase"] == "Running" and after.get("restarts", 0) == 0 and "Stalled" not in dj.events("quiet")
    assert {pod_index(p): p.metadata.uid for p in dj.pods("quiet")} == {i: p.metadata.uid for i, p in pods.items()}
