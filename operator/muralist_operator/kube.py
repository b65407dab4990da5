"""Side effects on the API server: create children, delete, patch status, post events.

Thin wrappers over the kubernetes client that make each call idempotent (409 on create and
404 on delete are the expected outcomes of a retry, not errors). Responses nobody reads are not
turned into client models (`_preload_content=False`): with hundreds of jobs starting at once,
that deserialization was a good part of the operator's CPU.

Every call has a deadline (`REQUEST_TIMEOUT`, applied by the client `Kube.connect` builds, to
the operator's calls and the progress endpoint's TokenReviews alike) and bounded retries
(`RETRIES`): a hung API server costs a thread a bounded wait, never a thread for good.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from muralist_api import GROUP, PLURAL, VERSION
from urllib3.exceptions import HTTPError
from urllib3.util.retry import Retry

from muralist_operator.decision import parse_time
from muralist_operator.observe import STOPPED_ANNOTATION, WarningEvent, controller_uid

log = logging.getLogger("muralist.operator")

# What a call raises when the API server refuses it (ApiException) or cannot be reached in time
# (urllib3's errors, OSError): for callers that say so in one line and try again later, without
# importing the kubernetes client themselves (only this module does: import-linter checks it).
CALL_FAILED: tuple[type[Exception], ...] = (ApiException, HTTPError, OSError)

# (connect, read) seconds: the read timeout bounds each wait for bytes of an answer. The API
# server answers our calls in milliseconds, and gives up on its own after 60 s; a connection
# that says nothing for REQUEST_TIMEOUT[1] is dead (an API server gone, a load balancer that
# dropped the connection without a reset).
REQUEST_TIMEOUT = (5.0, 15.0)
# Retried by urllib3, with backoff: a connection that could not be made (nothing was sent), one
# read that timed out or broke, and throttling or an API server in the middle of going away
# (429, 502-504; Retry-After honoured). Any verb: every call of ours can be repeated safely (a
# create answers 409 once the first one landed, a delete 404, a patch sets the same fields, a
# TokenReview has no effect). At worst a call takes about 2 x (5 + 15) s before it fails.
RETRIES = Retry(total=4, connect=2, read=1, status=2, other=0, allowed_methods=None,
                status_forcelist=(429, 502, 503, 504), backoff_factor=0.5, backoff_max=5.0, raise_on_status=False)


class TimedApiClient(client.ApiClient):  # type: ignore[misc]  # the kubernetes client has no type hints
    """An ApiClient whose every call has a timeout: REQUEST_TIMEOUT unless the call names its own."""

    request_timeout: tuple[float, float] = REQUEST_TIMEOUT

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.request_timeout
        return super().request(method, url, *args, **kwargs)


def _unread(fn: Any, *args: Any, **kwargs: Any) -> None:
    """Call without building client models from the response, then hand the connection back to
    the pool (an unread response keeps it, and the next call pays a new TLS handshake)."""
    resp = fn(*args, _preload_content=False, **kwargs)
    try:
        resp.read()
    finally:
        resp.release_conn()


class NameTaken(Exception):
    """A child's name is taken by an object that the DiffusionJob does not own: another job's, or
    someone else's. The job cannot run beside it (its pods would use it as their own)."""

    def __init__(self, kind: str, name: str, existing: dict[str, Any]) -> None:
        owners = [f"{r.get('kind')} {r.get('name')}" for r in (existing.get("metadata") or {}).get("ownerReferences")
                  or [] if r.get("controller")]
        whose = f"it belongs to {owners[0]}" if owners else "nothing owns it"
        super().__init__(f"{kind} {name} already exists and is not this DiffusionJob's ({whose}): delete it, or "
                         "create the DiffusionJob under another name")
        self.kind, self.name = kind, name


# Creates of a child whose name was taken, then free again before it could be read (an earlier job's
# object, collected meanwhile): never a Job created while its spec ConfigMap is missing.
CREATE_ATTEMPTS = 3


class NameHeld(Exception):
    """A child's name is held by an object on its way out: one being deleted, or one of an earlier
    DiffusionJob of the same name (deleted: the garbage collector deletes what it owned). The job
    waits for it to go, and creates its own then."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"waiting for {kind} {name} of an earlier DiffusionJob of this name to be deleted")
        self.kind, self.name = kind, name


def _earlier(existing: dict[str, Any], owner: dict[str, Any]) -> bool:
    """Whether `existing` is going: being deleted, or owned by an earlier object of the owner's kind
    and name (there is one such object at a time: a different uid is one that was deleted)."""
    meta = existing.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return True
    return any(r.get("controller") and r.get("kind") == owner.get("kind") and r.get("name") == owner["metadata"]["name"]
               for r in meta.get("ownerReferences") or [])


def _event_time(event: dict[str, Any]) -> str:
    """When an Event (core/v1, written by either events API) was last seen, as an RFC 3339 string."""
    series = event.get("series") or {}
    return (series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
            or event.get("firstTimestamp") or (event.get("metadata") or {}).get("creationTimestamp") or "")


def load_config() -> None:
    # Typed here: the client's loaders are untyped in some releases (37) and typed in others (36).
    in_cluster: Callable[[], None] = config.load_incluster_config
    from_kubeconfig: Callable[[], None] = config.load_kube_config
    try:
        in_cluster()
    except config.ConfigException:
        from_kubeconfig()


@dataclass
class Kube:
    core: client.CoreV1Api
    batch: client.BatchV1Api
    custom: client.CustomObjectsApi
    authentication: client.AuthenticationV1Api
    networking: client.NetworkingV1Api

    @classmethod
    def connect(cls, pool: int = 64, configuration: client.Configuration | None = None) -> Kube:
        """The operator's clients (`configuration`: the loaded kubeconfig's unless given)."""
        config_ = configuration or client.Configuration.get_default_copy()
        # kopf's workers, the clock and the progress endpoint's verifiers share this client.
        config_.connection_pool_maxsize = pool
        config_.retries = RETRIES
        api = TimedApiClient(config_)
        return cls(
            client.CoreV1Api(api),
            client.BatchV1Api(api),
            client.CustomObjectsApi(api),
            client.AuthenticationV1Api(api),
            client.NetworkingV1Api(api),
        )

    # -- the DiffusionJob itself

    def get_diffusion_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            job = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            return cast("dict[str, Any]", job)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """The job as written (the reconciler's next pass starts from it)."""
        job = self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                                {"status": status})
        return cast("dict[str, Any]", job)

    def delete_diffusion_job(self, namespace: str, name: str) -> None:
        self._ignore(
            404,
            self.custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            propagation_policy="Background",
        )

    # -- nodes: what strategy Auto plans for (planning.py)

    def node_labels(self, selector: str) -> list[dict[str, str]]:
        """The labels of the nodes a label selector matches; [] when this operator may not list nodes (a
        chart installed without rbac.discovery): Auto then plans without their labels."""
        try:
            nodes = self.core.list_node(label_selector=selector or None)
        except ApiException as e:
            if e.status in (401, 403):
                log.warning("cannot list nodes (%s): strategy Auto plans without their GPU labels", e.reason)
                return []
            raise
        return [dict(n.metadata.labels or {}) for n in nodes.items]

    # -- children

    def create(self, obj: dict[str, Any], owner: dict[str, Any]) -> bool:
        """Create a child owned by the DiffusionJob (its controller). False when it exists already
        and is the job's; NameHeld while an earlier job's object of that name is going; NameTaken
        when the name is taken by an object the job does not own."""
        kopf.append_owner_reference(obj, owner=owner)  # type: ignore[arg-type]  # a plain dict serves as a Body
        ns, name, kind = obj["metadata"]["namespace"], obj["metadata"]["name"], obj["kind"]
        creators = {
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "Job": self.batch.create_namespaced_job,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
        }
        readers = {
            "Service": self.core.read_namespaced_service,
            "ConfigMap": self.core.read_namespaced_config_map,
            "Job": self.batch.read_namespaced_job,
            "NetworkPolicy": self.networking.read_namespaced_network_policy,
        }
        for _attempt in range(CREATE_ATTEMPTS):
            try:
                _unread(creators[kind], ns, obj)
            except ApiException as e:
                if e.status != 409:
                    raise
            else:
                return True
            try:
                existing = json.loads(readers[kind](name, ns, _preload_content=False).data)
            except ApiException as e:
                if e.status == 404:  # gone between the two calls (an earlier job's, just collected): again
                    continue
                raise
            if controller_uid(existing) == owner["metadata"].get("uid"):
                return False
            if _earlier(existing, owner):
                raise NameHeld(kind, name)
            raise NameTaken(kind, name, existing)
        raise NameHeld(kind, name)  # it keeps coming and going: the next event tries again

    def delete_job(self, namespace: str, name: str) -> None:
        # Foreground: the Job object stays until its pods are gone, so a Job created again
        # never meets the old pods (same hostnames).
        self._ignore(404, _unread, self.batch.delete_namespaced_job, name, namespace, propagation_policy="Foreground")

    def stop_pod(self, namespace: str, name: str, uid: str, reason: str, note: str) -> None:
        """Note on the pod why it goes (its index's failure says so), then delete that very pod
        (the uid precondition: never a replacement of the same name)."""
        try:
            _unread(self.core.patch_namespaced_pod, name, namespace,
                    {"metadata": {"annotations": {STOPPED_ANNOTATION: f"{reason}: {note}"}}})
        except ApiException as e:
            if e.status == 404:
                return
            raise
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        try:
            _unread(self.core.delete_namespaced_pod, name, namespace, body=body)
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or another pod of that name now
                raise

    def label_pod(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        _unread(self.core.patch_namespaced_pod, name, namespace, {"metadata": {"labels": labels}})

    def set_job_suspend(self, namespace: str, name: str, suspend: bool) -> None:
        self._ignore(404, _unread, self.batch.patch_namespaced_job, name, namespace, {"spec": {"suspend": suspend}})

    def resize_job(self, namespace: str, name: str, nodes: int) -> None:
        # One patch: the API server accepts a change of an Indexed Job's size only when completions
        # and parallelism stay equal.
        body = {"spec": {"completions": nodes, "parallelism": nodes}}
        self._ignore(404, _unread, self.batch.patch_namespaced_job, name, namespace, body)

    # -- events

    def latest_warning(self, namespace: str, uid: str) -> WarningEvent | None:
        """The latest Warning event about the object of `uid` (what its status may not say)."""
        resp = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.uid={uid},type=Warning", _preload_content=False)
        items = json.loads(resp.data).get("items") or []
        if not items:
            return None
        latest = max(items, key=lambda e: parse_time(_event_time(e)) or datetime.min.replace(tzinfo=UTC))
        return WarningEvent(reason=latest.get("reason") or "", message=latest.get("message") or "",
                            time=parse_time(_event_time(latest)))

    def post_event(self, owner: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = owner["metadata"]
        now = datetime.now(UTC)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "muralist-operator"},
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
            "reportingComponent": "muralist.dev/operator",
            "reportingInstance": "muralist-operator",
        }
        try:
            _unread(self.core.create_namespaced_event, meta["namespace"], event)
        except (ApiException, HTTPError, OSError) as e:  # an event lost is not worth failing a reconcile
            log.warning("could not post event %s for %s: %s", reason, meta["name"], getattr(e, "reason", None) or e)

    @staticmethod
    def _ignore(status: int, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except ApiException as e:
            if e.status != status:
                raise
