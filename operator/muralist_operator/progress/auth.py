"""Who is posting: a projected service-account token, reviewed by the API server, bound to a pod.

Two steps, so the server can answer 401 before it reads the body and 403 after:

- `authenticate(token)`: a TokenReview with audience `muralist.dev` must say authenticated and
  carry that audience; a pod-bound token's `user.extra` names the pod (name and uid). Verdicts
  are cached per token hash: positive ones until a few minutes pass or the token expires
  (whichever is first), negative ones briefly, so 1,000 pods posting every few seconds cost a
  TokenReview per pod per token rotation, not per post.
- `authorize(identity, namespace, job, pod, index)`: the token's pod must exist in the URL's
  namespace with the token's uid (the API server forgets deleted pods' tokens; the cache must
  not outlive the pod either), carry `muralist.dev/job-name=<job>`, be the pod the body names, at
  the completion index it claims, and be owned by the job's own Job (its controller's uid): a
  label or a name anyone who may create pods in the namespace can copy, an owner reference to
  the Job only the Job controller writes. The lookups are callbacks: the operator's kopf indexes
  (in memory, non-blocking), or `api_pod_lookup` and `api_job_lookup` over the API (tests).

Everything here is synchronous and thread-safe; the server calls it from worker threads.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from kubernetes.client.exceptions import ApiException
from muralist_api.contract import COMPLETION_INDEX_ANNOTATION, PROGRESS_AUDIENCE
from urllib3.exceptions import HTTPError

from muralist_operator.naming import LABEL_JOB

log = logging.getLogger("muralist.progress.auth")

EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
COMPLETION_INDEX = COMPLETION_INDEX_ANNOTATION

POSITIVE_TTL_SECONDS = 300.0
NEGATIVE_TTL_SECONDS = 10.0
# A token is not trusted up to its last second: clocks differ and a post takes time.
EXPIRY_MARGIN_SECONDS = 30.0
MAX_CACHE_ENTRIES = 20_000
# (connect, read) seconds of one TokenReview: a pod waits 10 s for its post's answer (the
# runtime's report/push.py), and a verifier thread held longer holds up the posts behind it.
REVIEW_TIMEOUT = (3.0, 4.0)


@dataclass(frozen=True)
class Identity:
    namespace: str  # the service account's, from the username
    service_account: str
    pod_name: str
    pod_uid: str
    cache_key: str = field(default="", repr=False, compare=False)


@dataclass(frozen=True)
class AuthVerdict:
    """What a token check says: the HTTP status to answer, why, and whose token it was."""

    status: HTTPStatus  # OK, UNAUTHORIZED, FORBIDDEN, or SERVICE_UNAVAILABLE (could not ask)
    reason: str
    identity: Identity | None = None

    @property
    def ok(self) -> bool:
        return self.status == HTTPStatus.OK


@dataclass(frozen=True)
class PodInfo:
    name: str
    uid: str
    job: str | None  # the muralist.dev/job-name label
    index: int | None  # the completion index, when the pod has one
    owner_uid: str = ""  # its controller's uid: the Job that created it


PodLookup = Callable[[str, str], "PodInfo | None"]  # (namespace, name) -> the pod, or None when gone
# (namespace, diffusionjob) -> the uid of the Job it owns (whose pods may post), or None when it has none
JobLookup = Callable[[str, str], "str | None"]


def pod_info(body: Mapping[str, Any]) -> PodInfo:
    """A PodInfo from a pod as the API (or a kopf index) returns it."""
    meta = body.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    raw = annotations.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX))
    try:
        index = int(raw) if raw is not None else None
    except ValueError:
        index = None
    owner = next((r.get("uid") or "" for r in meta.get("ownerReferences") or [] if r.get("controller")), "")
    return PodInfo(name=meta.get("name", ""), uid=meta.get("uid", ""), job=labels.get(LABEL_JOB), index=index,
                   owner_uid=owner)


def api_pod_lookup(core_v1: Any) -> PodLookup:
    """A lookup that reads the pod from the API server (one GET per post: for tests, not for load)."""

    def lookup(namespace: str, name: str) -> PodInfo | None:
        try:
            resp = core_v1.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return pod_info(json.loads(resp.data))

    return lookup


def api_job_lookup(batch_v1: Any) -> JobLookup:
    """A lookup that reads the Job named as the diffusionjob, labelled as its, from the API server
    (for tests: the operator's own lookup also checks that the diffusionjob owns it)."""

    def lookup(namespace: str, name: str) -> str | None:
        try:
            resp = batch_v1.read_namespaced_job(name, namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        meta = json.loads(resp.data).get("metadata") or {}
        return meta.get("uid") if (meta.get("labels") or {}).get(LABEL_JOB) == name else None

    return lookup


def token_expiry(token: str) -> float | None:
    """The JWT's `exp` (Unix seconds), read without checking the signature: only ever used after
    the API server accepted the token, to cap how long we trust it."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
        return float(exp) if isinstance(exp, int | float) else None
    except (IndexError, ValueError, AttributeError):
        return None


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenVerifier:
    def __init__(
        self,
        authentication_api: Any,  # kubernetes.client.AuthenticationV1Api
        pods: PodLookup,
        jobs: JobLookup,
        audience: str = PROGRESS_AUDIENCE,
        positive_ttl: float = POSITIVE_TTL_SECONDS,
        negative_ttl: float = NEGATIVE_TTL_SECONDS,
        max_entries: int = MAX_CACHE_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = authentication_api
        self._pods = pods
        self._jobs = jobs
        self.audience = audience
        self.positive_ttl = positive_ttl
        self.negative_ttl = negative_ttl
        self.max_entries = max_entries
        self._clock = clock
        self._wall = wall_clock
        self._cache: dict[str, tuple[float, AuthVerdict]] = {}
        self._lock = threading.Lock()
        self.reviews = 0  # TokenReviews sent: what the cache is for

    # -- step 1: who is this -----------------------------------------------------------------

    def cached(self, token: str | None) -> bool:
        """True when `authenticate` would answer from the cache, without a TokenReview."""
        if not token:
            return True
        hit = self._cache.get(_hash(token))  # a dict read is atomic; a stale answer costs a hop, no more
        return hit is not None and hit[0] > self._clock()

    def authenticate(self, token: str | None) -> AuthVerdict:
        if not token:
            return AuthVerdict(HTTPStatus.UNAUTHORIZED, "no bearer token")
        key = _hash(token)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                if hit[0] > now:
                    return hit[1]
                del self._cache[key]
        verdict = self._review(token, key)
        if verdict.status in (HTTPStatus.OK, HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            self._remember(key, verdict, self._ttl(token, verdict), now)
        return verdict

    def _review(self, token: str, key: str) -> AuthVerdict:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        try:
            self.reviews += 1
            review = self._api.create_token_review(body, _request_timeout=REVIEW_TIMEOUT)
        except ApiException as e:
            # Our own problem (RBAC, the API server away), not the pod's: let it retry, cache nothing.
            return AuthVerdict(HTTPStatus.SERVICE_UNAVAILABLE, f"TokenReview failed: {e.status} {e.reason}")
        except (HTTPError, OSError) as e:  # no answer in time (kube.RETRIES retried it once), or no connection
            return AuthVerdict(HTTPStatus.SERVICE_UNAVAILABLE,
                           f"TokenReview failed: the API server did not answer ({type(e).__name__})")
        status = review.status
        if status is None or not status.authenticated:
            error = (status.error if status is not None else None) or "not authenticated"
            return AuthVerdict(HTTPStatus.UNAUTHORIZED, f"token refused: {error}")
        if self.audience not in (status.audiences or []):
            # An API server that ignores spec.audiences answers for its own audience: not ours.
            return AuthVerdict(HTTPStatus.UNAUTHORIZED, f"token is not for audience {self.audience}")
        user = status.user
        username = (user.username if user is not None else None) or ""
        extra = (user.extra if user is not None else None) or {}
        pod_name, pod_uid = (extra.get(EXTRA_POD_NAME) or [None])[0], (extra.get(EXTRA_POD_UID) or [None])[0]
        if not username.startswith(SERVICE_ACCOUNT_PREFIX) or not pod_name or not pod_uid:
            return AuthVerdict(HTTPStatus.FORBIDDEN,
                               f"{username or 'the token'} is not a pod-bound service-account token")
        namespace, _, account = username[len(SERVICE_ACCOUNT_PREFIX):].partition(":")
        identity = Identity(namespace, account, pod_name, pod_uid, cache_key=key)
        return AuthVerdict(HTTPStatus.OK, "authenticated", identity)

    def _ttl(self, token: str, verdict: AuthVerdict) -> float:
        if not verdict.ok:
            return self.negative_ttl
        exp = token_expiry(token)
        if exp is None:
            return self.positive_ttl
        return min(self.positive_ttl, exp - self._wall() - EXPIRY_MARGIN_SECONDS)

    def _remember(self, key: str, verdict: AuthVerdict, ttl: float, now: float) -> None:
        if ttl <= 0:
            return
        with self._lock:
            self._cache[key] = (now + ttl, verdict)
            if len(self._cache) > self.max_entries:
                # Expired entries first; then the oldest (dicts keep insertion order).
                for k in [k for k, (until, _) in self._cache.items() if until <= now]:
                    del self._cache[k]
                while len(self._cache) > self.max_entries:
                    del self._cache[next(iter(self._cache))]

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def forget(self, identity: Identity) -> None:
        with self._lock:
            self._cache.pop(identity.cache_key, None)

    # -- step 2: may it post this ------------------------------------------------------------

    def authorize(self, identity: Identity, namespace: str, job: str, pod: str, index: int) -> AuthVerdict:
        who = f"pod {identity.namespace}/{identity.pod_name}"
        if identity.namespace != namespace:
            return AuthVerdict(HTTPStatus.FORBIDDEN, f"{who} cannot post for namespace {namespace}", identity)
        info = self._pods(namespace, identity.pod_name)
        if info is None or info.uid != identity.pod_uid:
            # The token's pod is gone (or a pod of the same name replaced it): the API server would refuse
            # the token now too, so the cached verdict goes.
            self.forget(identity)
            gone = "no longer exists" if info is None else f"was replaced (uid {info.uid}, token's {identity.pod_uid})"
            return AuthVerdict(HTTPStatus.UNAUTHORIZED, f"{who} {gone}", identity)
        if info.job != job:
            return AuthVerdict(HTTPStatus.FORBIDDEN, f"{who} is not a pod of diffusionjob {job}", identity)
        if pod != identity.pod_name:
            return AuthVerdict(HTTPStatus.FORBIDDEN, f"{who} cannot post as pod {pod}", identity)
        if info.index is None:
            return AuthVerdict(HTTPStatus.FORBIDDEN, f"{who} has no completion index: it is no pod of a Job", identity)
        if index != info.index:
            return AuthVerdict(HTTPStatus.FORBIDDEN, f"{who} has completion index {info.index}, not {index}", identity)
        workers = self._jobs(namespace, job)
        if workers is None or info.owner_uid != workers:
            return AuthVerdict(HTTPStatus.FORBIDDEN, f"{who} is not owned by the Job of diffusionjob {job}", identity)
        return AuthVerdict(HTTPStatus.OK, "authorized", identity)
