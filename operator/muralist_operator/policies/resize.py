"""Resizing a running job: spec.parallelism.nodes moved (kubectl scale, or an edit).

The Job is an elastic Indexed Job: its completions and parallelism change together. Growing
adds indexes whose pods start claiming work at once; shrinking makes the Job controller delete
the highest indexes, whose pods drain (finish the item in flight, hand their chunk back) and
are never counted as failures: their indexes are outside the Job now. Work is claimed chunk by
chunk from the first pod's store, so no item is lost or rendered twice by a resize; the first
pod stays (nodes >= 1), and with it the store and the merge.
"""

from __future__ import annotations

from muralist_api.job import DiffusionJob

from muralist_operator.decision import ResizeJob, Transition
from muralist_operator.observe import JobView, PodView

REASON_RESIZED = "Resized"


def apply(t: Transition, job: DiffusionJob, current: JobView) -> None:
    """Move the Job to the asked size; status.nodes says what runs now."""
    wanted = job.spec.parallelism.nodes
    t.status.nodes = current.completions if current.completions is not None else wanted
    if current.completions in (None, wanted) or current.complete or current.failed or current.deleting:
        return
    t.act(ResizeJob(wanted))
    t.event("Normal", REASON_RESIZED, f"resizing from {current.completions} to {wanted} pod(s)"
            + (": the highest indexes finish their items in flight and hand back their work"
               if wanted < current.completions else ": the new pods claim work as soon as they start"))


def in_range(pods: list[PodView], current: JobView) -> list[PodView]:
    """The pods of the Job's indexes: those of removed indexes drain and leave, and neither their
    exit nor their absence is a failure (the Job controller does not count them either)."""
    size = current.completions
    return pods if size is None else [p for p in pods if p.index < size]
