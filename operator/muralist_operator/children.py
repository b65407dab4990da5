"""A job's children made: rendered before anything is written, created once, created again when gone.

A decision that creates the children (`CreateJob`, or `RestoreChildren` for those gone) has them
rendered first (`render_for`): a job that cannot be rendered fails with the reason before its
status says anything else, instead of waiting for pods forever. `ChildCreator` then creates
them. kopf's indexes show a child a moment after its creation, and the burst of events right
after one would create it again: so for `CREATE_GRACE_SECONDS` after creating a job's children
nothing of that job is created again (a restore is decided again once the grace is over).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from muralist_api.job import DiffusionJob

from muralist_operator.decision import CreateJob, Decision, RestoreChildren
from muralist_operator.indexes import Key
from muralist_operator.kube import Kube
from muralist_operator.render import Children, render_children
from muralist_operator.settings import OperatorSettings

log = logging.getLogger("muralist.operator")

CREATE_GRACE_SECONDS = 10.0


class RenderFailure(Exception):
    """The children of a valid job could not be rendered (a bug, or a limit only render sees)."""


def render_for(job: DiffusionJob, key: Key, decision: Decision, settings: OperatorSettings) -> Children | None:
    """The children a CreateJob or RestoreChildren of `decision` needs; None when it has neither."""
    create = next((a for a in decision.actions if isinstance(a, CreateJob | RestoreChildren)), None)
    if create is None:
        return None
    deadline = create.active_deadline_seconds if isinstance(create, CreateJob) else None
    try:
        return render_children(job, key[0], settings, active_deadline_seconds=deadline)
    except Exception as e:  # pure code: whatever it raises, retrying the same spec repeats it
        log.exception("rendering %s/%s failed", *key)
        raise RenderFailure(f"the operator cannot build this job's pods: {e}") from e


class ChildCreator:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        # When we last created a job's children (monotonic).
        self.created: dict[Key, float] = {}

    def forget(self, key: Key) -> None:
        """Nothing of this job was created lately (it is gone, or an earlier job's objects were)."""
        self.created.pop(key, None)

    def create(self, owner: dict[str, Any], children: Children) -> bool:
        """True when this call created the Job (not a repeat while the index catches up)."""
        key = (owner["metadata"]["namespace"], owner["metadata"]["name"])
        if time.monotonic() - self.created.get(key, -CREATE_GRACE_SECONDS) < CREATE_GRACE_SECONDS:
            return False
        self.created[key] = time.monotonic()
        created_job = False
        for child in children.all():
            created = self.kube.create(child, owner)
            created_job = created_job or (created and child["kind"] == "Job")
        return created_job

    def restore(self, owner: dict[str, Any], children: Children, action: RestoreChildren,
                decision: Decision) -> bool:
        """True when this call created one of them. Not while the indexes may not show what was
        just created: then the job is decided again once they had the time."""
        key = (owner["metadata"]["namespace"], owner["metadata"]["name"])
        grace = CREATE_GRACE_SECONDS - (time.monotonic() - self.created.get(key, -CREATE_GRACE_SECONDS))
        if grace > 0:
            again = datetime.now(UTC) + timedelta(seconds=grace)
            if decision.check_again_at is None or again < decision.check_again_at:
                decision.check_again_at = again
            return False
        self.created[key] = time.monotonic()
        wanted = set(action.children)
        restored = False
        for child in children.all():
            if (child["kind"], child["metadata"]["name"]) in wanted:
                log.info("creating %s %s/%s again: it was gone", child["kind"], key[0], child["metadata"]["name"])
                restored = self.kube.create(child, owner) or restored
        return restored
