"""Following a job: each watch resumes from the last resourceVersion seen, an expired one (410) reads
the job again, a deletion and the timeout end the wait. The API is scripted here; the cluster tests
(tests/cluster/test_client.py) follow real watches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from muralist import JobDeleted, WaitTimeout
from muralist import follow as following


def job(version: int, phase: str | None = None, completed: int = 0) -> dict[str, Any]:
    status = {"phase": phase, "progress": {"total": 4, "completed": completed}} if phase else None
    return {"metadata": {"name": "cats", "resourceVersion": str(version)}, "status": status}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "raw_object": obj, "object": obj}


class ScriptedApi:
    """`get` answers the next of `gets`; each watch request plays the next of `watches` (events, or an
    exception to raise) and records the resourceVersion it was asked to start from."""

    def __init__(self, gets: list[dict[str, Any]], watches: list[list[dict[str, Any]] | Exception]):
        self.gets, self.watches, self.watched_from = gets, watches, []

    def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        return self.gets.pop(0)

    def list_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("only called through the scripted watch")


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(api: ScriptedApi) -> ScriptedApi:
        class Watch:
            def stream(self, func: Any, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
                assert kwargs["field_selector"] == "metadata.name=cats" and kwargs["timeout_seconds"] >= 1
                api.watched_from.append(kwargs["resource_version"])
                played = api.watches.pop(0)
                if isinstance(played, Exception):
                    raise played
                yield from played

        monkeypatch.setattr(watch, "Watch", Watch)
        return api

    return install


def phases(api: ScriptedApi, timeout: float | None = None) -> list[tuple[str, int]]:
    return [(s.phase, s.progress.completed) for s in following.follow(api, "ns", "cats", timeout)]


def test_each_watch_resumes_from_the_last_version_and_a_410_reads_the_job_again(scripted: Any) -> None:
    api = scripted(ScriptedApi(
        gets=[job(10, "Pending"), job(30, "Running", completed=2)],
        watches=[
            [event("MODIFIED", job(11, "Running")), event("BOOKMARK", {"metadata": {"resourceVersion": "15"}})],
            [event("MODIFIED", job(16, "Running"))],  # nothing changed but the version: not yielded
            ApiException(status=410, reason="Gone"),
            # Following stops at Succeeded: the deletion after it is never read.
            [event("MODIFIED", job(31, "Succeeded", completed=4)), event("DELETED", job(32, "Succeeded"))],
        ]))
    assert phases(api) == [("Pending", 0), ("Running", 0), ("Running", 2), ("Succeeded", 4)]
    assert api.watched_from == ["10", "15", "16", "30"]


def test_a_finished_job_is_answered_by_the_get_alone(scripted: Any) -> None:
    api = scripted(ScriptedApi(gets=[job(5, "Failed")], watches=[]))
    assert phases(api) == [("Failed", 0)] and api.watched_from == []


def test_a_deleted_job_and_a_timeout_end_the_wait(scripted: Any) -> None:
    api = scripted(ScriptedApi(gets=[job(1, "Running")], watches=[[event("DELETED", job(2, "Running"))]]))
    with pytest.raises(JobDeleted, match="deleted before it finished"):
        phases(api)
    api = scripted(ScriptedApi(gets=[job(1, "Running", completed=1)], watches=[[], [], []]))
    with pytest.raises(WaitTimeout) as err:
        phases(api, timeout=0)
    assert err.value.last_status.progress.completed == 1 and api.watched_from == []


def test_another_api_error_is_raised(scripted: Any) -> None:
    api = scripted(ScriptedApi(gets=[job(1, "Running")], watches=[ApiException(status=403, reason="Forbidden")]))
    with pytest.raises(ApiException) as err:
        phases(api)
    assert err.value.status == 403
