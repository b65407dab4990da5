"""Following one DiffusionJob's status with a Kubernetes watch, resumed from its resourceVersion.

`follow` yields the status each time it changes, until the job is Succeeded or Failed: a get
first (the job may be done already), then watches from that resourceVersion. A watch the API
server ends (its timeout, a restart) resumes from the last version seen, never from the start;
one whose version has expired (410 Gone) gets the object again and watches from there. Each
watch is bounded by what is left of the caller's timeout, so no wait outlives it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from muralist_api.job import GROUP, PLURAL, VERSION
from muralist_api.status import TERMINAL_PHASES, DiffusionJobStatus

from muralist.errors import JobDeleted, WaitTimeout

# Longest single watch request: the API server closes it after this, and it is resumed.
WATCH_WINDOW_SECONDS = 300
HTTP_GONE = 410


def status_of(obj: dict[str, Any]) -> DiffusionJobStatus:
    """The typed status of a DiffusionJob as the API returns it (an empty one before the operator writes any)."""
    return DiffusionJobStatus.model_validate(obj.get("status") or {})


def is_finished(status: DiffusionJobStatus) -> bool:
    return status.phase in TERMINAL_PHASES


def follow(custom: Any, namespace: str, name: str, timeout: float | None = None) -> Iterator[DiffusionJobStatus]:
    """Statuses of the job as they change, the last one Succeeded or Failed.

    `custom` is a kubernetes CustomObjectsApi. Raises WaitTimeout once `timeout` seconds have
    passed (carrying the last status), JobDeleted if the job goes away, and the client's
    ApiException for anything else (404 when there is no such job).
    """
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    deadline = None if timeout is None else time.monotonic() + timeout
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    status = status_of(obj)
    yield status
    version = obj["metadata"]["resourceVersion"]
    while not is_finished(status):
        window = WATCH_WINDOW_SECONDS
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(name, timeout or 0, status)
            window = min(window, max(1, round(left)))
        try:
            for event in watch.Watch().stream(
                custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                field_selector=f"metadata.name={name}", resource_version=version, allow_watch_bookmarks=True,
                timeout_seconds=window, _request_timeout=(30, window + 30),
            ):
                raw = event["raw_object"]
                version = raw["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                if event["type"] == "DELETED":
                    raise JobDeleted(name, status)
                changed = status_of(raw)
                if changed != status:
                    status = changed
                    yield status
                if is_finished(status):
                    return
        except ApiException as e:
            if e.status != HTTP_GONE:
                raise
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            version = obj["metadata"]["resourceVersion"]
            if (changed := status_of(obj)) != status:
                status = changed
                yield status
