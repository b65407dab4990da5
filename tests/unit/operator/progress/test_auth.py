"""Token verification with a fake TokenReview API: the cache, the expiry cap, the pod binding."""

from __future__ import annotations

import base64
import json
from http import HTTPStatus
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from muralist_operator.progress.auth import (
    EXTRA_POD_NAME,
    EXTRA_POD_UID,
    PodInfo,
    TokenVerifier,
    pod_info,
    token_expiry,
)

WALL = 1_800_000_000.0


def jwt(name: str, exp: float | None = WALL + 600) -> str:
    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    claims: dict[str, Any] = {"sub": name} if exp is None else {"sub": name, "exp": int(exp)}
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


class FakeAuthApi:
    """TokenReview as the API server answers it, for the tokens registered here."""

    def __init__(self) -> None:
        self.tokens: dict[str, client.V1TokenReviewStatus] = {}
        self.calls = 0
        self.broken = False

    def pod_token(self, token: str, pod: str, uid: str, namespace: str = "team-a",
                  audiences: tuple[str, ...] = ("muralist.dev",)) -> str:
        user = client.V1UserInfo(username=f"system:serviceaccount:{namespace}:runner",
                                 extra={EXTRA_POD_NAME: [pod], EXTRA_POD_UID: [uid]})
        self.tokens[token] = client.V1TokenReviewStatus(authenticated=True, audiences=list(audiences), user=user)
        return token

    def create_token_review(self, body: dict[str, Any], **_: Any) -> client.V1TokenReview:
        self.calls += 1
        if self.broken:
            raise ApiException(status=403, reason="Forbidden")
        assert body["spec"]["audiences"] == ["muralist.dev"]
        status = self.tokens.get(body["spec"]["token"])
        if status is None:
            status = client.V1TokenReviewStatus(authenticated=False, error="invalid bearer token")
        return client.V1TokenReview(spec=client.V1TokenReviewSpec(token=body["spec"]["token"]), status=status)


class World:
    def __init__(self) -> None:
        self.api = FakeAuthApi()
        self.pods: dict[tuple[str, str], PodInfo] = {
            ("team-a", "cats-0"): PodInfo("cats-0", "uid-0", "cats", 0, owner_uid="job-cats"),
            ("team-a", "cats-1"): PodInfo("cats-1", "uid-1", "cats", 1, owner_uid="job-cats"),
            ("team-a", "dogs-0"): PodInfo("dogs-0", "uid-d", "dogs", 0, owner_uid="job-dogs"),
            # Labelled as a pod of cats by someone who may create pods: no Job owns it.
            ("team-a", "mine"): PodInfo("mine", "uid-m", "cats", 0),
            # Owned by a Job, without a completion index (no pod of an Indexed Job).
            ("team-a", "loose"): PodInfo("loose", "uid-l", "cats", None, owner_uid="job-cats"),
        }
        # The Job each diffusionjob owns (the operator's index; gone: None).
        self.jobs: dict[tuple[str, str], str] = {("team-a", "cats"): "job-cats", ("team-a", "dogs"): "job-dogs"}
        self.now, self.wall = 100.0, WALL
        self.verifier = TokenVerifier(self.api, lambda ns, name: self.pods.get((ns, name)),
                                      lambda ns, name: self.jobs.get((ns, name)),
                                      clock=lambda: self.now, wall_clock=lambda: self.wall)

    def verify(self, token: str | None, namespace: str = "team-a", job: str = "cats", pod: str = "cats-0",
               index: int = 0) -> tuple[HTTPStatus, str]:
        verdict = self.verifier.authenticate(token)
        if verdict.ok:
            assert verdict.identity is not None
            verdict = self.verifier.authorize(verdict.identity, namespace, job, pod, index)
        return verdict.status, verdict.reason


@pytest.fixture
def world() -> World:
    return World()


def test_a_pod_of_the_job_is_accepted_and_reviewed_once(world: World) -> None:
    token = world.api.pod_token(jwt("cats-0"), "cats-0", "uid-0")
    assert not world.verifier.cached(token)
    for _ in range(50):
        assert world.verify(token) == (HTTPStatus.OK, "authorized")
    assert world.api.calls == 1
    assert world.verifier.cached(token)


CASES: dict[str, tuple[dict[str, Any], dict[str, Any], HTTPStatus, str]] = {
    # (token registration, request) -> verdict
    "no token": ({}, {"token": None}, HTTPStatus.UNAUTHORIZED, "no bearer token"),
    "unknown token": ({}, {"token": "garbage"}, HTTPStatus.UNAUTHORIZED, "invalid bearer token"),
    "another audience": ({"audiences": ("other.example",)}, {}, HTTPStatus.UNAUTHORIZED,
                         "not for audience muralist.dev"),
    "another job": ({}, {"job": "dogs"}, HTTPStatus.FORBIDDEN, "is not a pod of diffusionjob dogs"),
    "another namespace in the URL": ({}, {"namespace": "team-b"}, HTTPStatus.FORBIDDEN,
                                     "cannot post for namespace team-b"),
    "a token of another namespace": ({"namespace": "team-b"}, {}, HTTPStatus.FORBIDDEN,
                                     "cannot post for namespace team-a"),
    "posting as a sibling pod": ({}, {"pod": "cats-1"}, HTTPStatus.FORBIDDEN, "cannot post as pod cats-1"),
    "claiming another index": ({}, {"index": 1}, HTTPStatus.FORBIDDEN, "has completion index 0, not 1"),
    "the pod is gone": ({"pod": "cats-9"}, {"pod": "cats-9"}, HTTPStatus.UNAUTHORIZED, "no longer exists"),
    "a pod of the same name replaced it": ({"uid": "uid-old"}, {}, HTTPStatus.UNAUTHORIZED, "was replaced"),
    "a pod with the job's label that no Job owns": ({"pod": "mine", "uid": "uid-m"}, {"pod": "mine"},
                                                    HTTPStatus.FORBIDDEN,
                                                    "is not owned by the Job of diffusionjob cats"),
    "a pod without a completion index": ({"pod": "loose", "uid": "uid-l"}, {"pod": "loose"}, HTTPStatus.FORBIDDEN,
                                         "has no completion index"),
}


def test_a_pod_of_a_job_that_is_not_the_diffusionjobs_own_is_forbidden(world: World) -> None:
    token = world.api.pod_token(jwt("a"), "cats-0", "uid-0")
    world.jobs[("team-a", "cats")] = "job-of-someone-else"  # cats' Job was deleted and another made
    assert world.verify(token) == (HTTPStatus.FORBIDDEN,
                                   "pod team-a/cats-0 is not owned by the Job of diffusionjob cats")
    del world.jobs[("team-a", "cats")]  # cats has no Job now
    assert world.verify(token)[0] == HTTPStatus.FORBIDDEN
    world.jobs[("team-a", "cats")] = "job-cats"
    assert world.verify(token) == (HTTPStatus.OK, "authorized")


@pytest.mark.parametrize("registration, request_args, status, reason", CASES.values(), ids=CASES.keys())
def test_verdicts(world: World, registration: dict[str, Any], request_args: dict[str, Any], status: HTTPStatus,
                  reason: str) -> None:
    reg = {"pod": "cats-0", "uid": "uid-0", **registration}
    token = world.api.pod_token(jwt("t"), reg.pop("pod"), reg.pop("uid"), **reg)
    args = {"token": token, **request_args}
    got, why = world.verify(**args)
    assert (got, reason in why) == (status, True), why


def test_a_token_that_is_not_pod_bound_is_forbidden(world: World) -> None:
    world.api.tokens["sa-token"] = client.V1TokenReviewStatus(
        authenticated=True, audiences=["muralist.dev"], user=client.V1UserInfo(username="system:serviceaccount:a:b"))
    assert world.verify("sa-token")[0] == HTTPStatus.FORBIDDEN


def test_negative_verdicts_are_cached_briefly(world: World) -> None:
    for _ in range(5):
        assert world.verify("garbage")[0] == HTTPStatus.UNAUTHORIZED
    assert world.api.calls == 1
    world.now += 11
    world.verify("garbage")
    assert world.api.calls == 2


def test_positive_verdicts_last_until_the_ttl_or_the_tokens_expiry(world: World) -> None:
    long_lived = world.api.pod_token(jwt("a", exp=WALL + 3600), "cats-0", "uid-0")
    short_lived = world.api.pod_token(jwt("b", exp=WALL + 100), "cats-0", "uid-0")
    world.verify(long_lived), world.verify(short_lived)
    assert world.api.calls == 2
    world.now += 71  # past the short token's exp minus the 30 s margin, within the 300 s TTL
    world.verify(long_lived), world.verify(short_lived)
    assert world.api.calls == 3
    world.now += 300
    world.verify(long_lived)
    assert world.api.calls == 4


def test_a_token_about_to_expire_is_not_cached(world: World) -> None:
    token = world.api.pod_token(jwt("a", exp=WALL + 10), "cats-0", "uid-0")
    world.verify(token), world.verify(token)
    assert world.api.calls == 2


def test_deleting_the_pod_drops_the_cached_verdict(world: World) -> None:
    token = world.api.pod_token(jwt("a"), "cats-0", "uid-0")
    assert world.verify(token)[0] == HTTPStatus.OK
    del world.pods[("team-a", "cats-0")]
    assert world.verify(token)[0] == HTTPStatus.UNAUTHORIZED
    world.api.tokens.pop(token)  # what the API server does once the pod is gone
    world.pods[("team-a", "cats-0")] = PodInfo("cats-0", "uid-0", "cats", 0, owner_uid="job-cats")
    assert world.verify(token)[0] == HTTPStatus.UNAUTHORIZED
    assert world.api.calls == 2


def test_a_failing_token_review_is_a_503_and_not_cached(world: World) -> None:
    token = world.api.pod_token(jwt("a"), "cats-0", "uid-0")
    world.api.broken = True
    status, reason = world.verify(token)
    assert (status, reason) == (HTTPStatus.SERVICE_UNAVAILABLE, "TokenReview failed: 403 Forbidden")
    world.api.broken = False
    assert world.verify(token)[0] == HTTPStatus.OK


def test_the_cache_is_bounded(world: World) -> None:
    world.verifier.max_entries = 10
    for i in range(25):
        world.verify(f"garbage-{i}")
    assert world.verifier.cache_size <= 10


def test_token_expiry_reads_exp_or_nothing() -> None:
    assert token_expiry(jwt("a", exp=WALL + 5)) == WALL + 5
    assert token_expiry(jwt("a", exp=None)) is None
    assert token_expiry("not-a-jwt") is None
    assert token_expiry("a.!!!.c") is None


def test_pod_info_reads_label_uid_completion_index_and_controller() -> None:
    body = {"metadata": {"name": "cats-1-x", "uid": "u", "labels": {"muralist.dev/job-name": "cats"},
                         "annotations": {"batch.kubernetes.io/job-completion-index": "1"},
                         "ownerReferences": [{"kind": "Job", "name": "cats", "uid": "j", "controller": True}]}}
    assert pod_info(body) == PodInfo("cats-1-x", "u", "cats", 1, owner_uid="j")
    assert pod_info({"metadata": {"name": "bare"}}) == PodInfo("bare", "", None, None)
