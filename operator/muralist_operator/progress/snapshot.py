"""A job's progress at one moment, as the aggregator (aggregate.py) sums up its pods' posts.

`JobProgress` is what the reconciler reads (observe.Observed.progress): the counts and their
rate for `status.progress`, each completion index's newest pod for stall detection
(`IndexProgress`), and whether the posts reach the endpoint at all (the last one accepted, the
last one refused: `PostError`). Plain frozen data.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class IndexProgress:
    """The newest pod of one completion index, as the reconciler needs it for stall detection."""

    index: int
    pod: str
    attempt: int
    done: int
    failed: int
    total: int
    progress_time: datetime | None
    posted_at: datetime | None  # when its last post was accepted (None: known from its termination message only)
    final: bool
    done_flag: bool = False  # the pod said its ranks have no more work

    @property
    def finished(self) -> bool:
        """Silence is expected from here on: the pod's last post, or its work is done. (Its counts
        cannot say so: with work claimed at run time no pod knows its share in advance, and
        `total` is the job's.)"""
        return self.final or self.done_flag


@dataclass(frozen=True)
class PostError:
    """A post the endpoint refused for a job (or could not check), as the pod was answered."""

    at: datetime
    status: int
    reason: str

    def describe(self) -> str:
        return f"{self.status} {self.reason}"


@dataclass(frozen=True)
class JobProgress:
    completed: int  # rendered or skipped (already on disk)
    failed: int
    total: int
    percent: float | None  # None while the total is unknown
    images_per_second: float | None  # None until the window has a span to divide by
    estimated_seconds_remaining: int | None
    ranks: int
    indexes: dict[int, IndexProgress]
    # The longest gap between two signs of progress of one pod, in seconds, seen since this
    # operator started (at the resolution of the pods' posts); None before any.
    slowest_gap_seconds: float | None = None
    # When a post of the job's pods was last accepted (any pod); None: none since this operator started.
    last_post: datetime | None = None
    # When the job's posts resumed after their latest break (None: no break since its first post
    # this operator accepted).
    reachable_since: datetime | None = None
    # The last post refused for the job, and when the refusals began (None once a post is accepted).
    last_error: PostError | None = None
    refused_since: datetime | None = None
    # Of `completed`: kept from before (made for the same request), and rendered again in place of an
    # output made for another request. The pods' counts while the job runs, the merged manifest's at its end.
    kept: int = 0
    rerendered: int = 0
    merged: bool = False  # the counts are the merged manifest's: the job's final word on its items
    # runPolicy.checkpoint: the merged manifest's steps taken from checkpoints and rendered again (None: none).
    steps_saved: int | None = None
    steps_lost: int | None = None

    @property
    def oldest_progress_time(self) -> datetime | None:
        """The longest-quiet unfinished index's last progress: what a stall timeout compares to."""
        times = [i.progress_time for i in self.indexes.values() if not i.finished and i.progress_time]
        return min(times, default=None)

    def status_fields(self) -> dict[str, Any]:
        """`status.progress` in the API's spelling."""
        return {
            "completed": self.completed,
            "failed": self.failed,
            "total": self.total,
            "kept": self.kept,
            "rerendered": self.rerendered,
            "percent": self.percent,
            "imagesPerSecond": self.images_per_second,
            "estimatedSecondsRemaining": self.estimated_seconds_remaining,
            "summary": f"{self.completed}/{self.total}",
        }
