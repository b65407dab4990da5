"""Pushed progress end to end through the operator under test: its HTTPS endpoint, TokenReview,
the pod check against its kopf index, the aggregator, the status it writes, and stall detection
from the reports. Each pod's posts are made here as the runtime's poster makes them, with the
URL, CA and token the pod is given (tests/cluster/test_pod_e2e.py runs the real runtime)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from muralist_api import contract

from tests.builders import make_job
from tests.kube_helpers import fate_annotations, set_pod_fate, wait_for
from tests.operator_helpers import DJ, pod_index

pytestmark = pytest.mark.cluster


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Poster:
    """One pod's poster: its URL, CA and a token bound to it, as the kubelet would mount them."""

    def __init__(self, dj: DJ, pod: Any, audience: str = contract.PROGRESS_AUDIENCE, as_pod: Any = None):
        env = {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}
        self.url = env[contract.MURALIST_PROGRESS_URL]
        job = pod.metadata.labels["muralist.dev/job-name"]
        ca = dj.core.read_namespaced_config_map(f"{job}-spec", dj.ns).data[contract.PROGRESS_CA_KEY]
        self.ctx = ssl.create_default_context(cadata=ca)
        bound = as_pod or pod
        spec = {"audiences": [audience], "expirationSeconds": contract.PROGRESS_TOKEN_SECONDS,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": bound.metadata.name,
                                   "uid": bound.metadata.uid}}
        self.token = dj.core.create_namespaced_service_account_token("default", dj.ns, {"spec": spec}).status.token
        self.pod, self.index = bound.metadata.name, pod_index(bound)

    def post(self, completed: int, total: int, step: datetime | None = None, done: bool = False,
             token: str | None = "mine", loading: bool = False) -> tuple[int, Any]:
        now = datetime.now(UTC)
        body = {"pod": self.pod, "index": self.index, "attempt": 0, "ranks": 1, "completed": completed,
                "skipped": 0, "failed": 0, "total": total,
                "lastStepTime": None if loading else stamp(step or now),
                "lastImageTime": None if loading else stamp(step or now), "sentAt": stamp(now), "final": False,
                "done": done}
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'mine' else token}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:
                text = resp.read()
                return resp.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


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
