"""Builders for what the operator observes (JobView, PodView, pushed progress), shared by the
decision tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from muralist_operator.decision import iso
from muralist_operator.observe import ContainerExit, JobView, PodView
from muralist_operator.progress.snapshot import IndexProgress, JobProgress, PostError

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def job_view(**fields: Any) -> JobView:
    base: dict[str, Any] = dict(deleting=False, suspended=False, complete=False, failed=False,
                                failure_reason="", failure_message="", ready=0,
                                start_time=iso(NOW - timedelta(seconds=30)))
    return JobView(**(base | fields))


def pod(index: int = 0, phase: str = "Running", failures: int = 0, term: ContainerExit | None = None,
        **fields: Any) -> PodView:
    """Pod `cats-<index>-<failures>` of retry `failures` of its index."""
    base: dict[str, Any] = dict(name=f"cats-{index}-{failures}", uid=f"uid-{index}-{failures}", deleting=False,
                                failure_count=failures, created=iso(NOW - timedelta(seconds=60 - failures)))
    return PodView(index=index, phase=phase, termination=term, **(base | fields))


def failed(index: int = 0, failures: int = 0, code: int = 1, message: str = "boom", **fields: Any) -> PodView:
    return pod(index, "Failed", failures, ContainerExit(code, "Error", message), **fields)


def index_progress(index: int = 0, done: int = 0, total: int = 10, last: datetime | None = None,
                   pod_name: str | None = None, finished: bool = False, failures: int = 0,
                   posted: datetime | None = None) -> IndexProgress:
    return IndexProgress(index=index, pod=pod_name or f"cats-{index}-{failures}", attempt=failures, done=done,
                         failed=0, total=total, progress_time=last, posted_at=posted, final=False, done_flag=finished)


def progress(*indexes: IndexProgress, total: int = 10, ips: float | None = None,
             eta: int | None = None, refused_since: datetime | None = None,
             last_error: PostError | None = None, reachable_since: datetime | None = None) -> JobProgress:
    """The job's last accepted post is its indexes' latest (`posted`); its posts resumed after a
    break at `reachable_since` (None: no break)."""
    done = sum(i.done for i in indexes)
    last_post = max((i.posted_at for i in indexes if i.posted_at is not None), default=None)
    return JobProgress(completed=done, failed=0, total=total, percent=round(100 * done / total, 1) if total else None,
                       images_per_second=ips, estimated_seconds_remaining=eta, ranks=len(indexes),
                       indexes={i.index: i for i in indexes}, last_post=last_post, last_error=last_error,
                       refused_since=refused_since, reachable_since=reachable_since)
