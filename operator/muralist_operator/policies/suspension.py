"""Suspension: by the user (runPolicy.suspend), or by Kueue until it admits the Job."""

from __future__ import annotations

from muralist_api.pods import RunPolicy

from muralist_operator.decision import Action, SetJobSuspend
from muralist_operator.observe import JobView


def created_suspended(policy: RunPolicy) -> bool:
    """A new Job starts suspended when the user asks, or for Kueue to admit it."""
    return bool(policy.suspend or policy.queue_name)


def reason(policy: RunPolicy) -> tuple[str, str]:
    """Reason and message of a suspended job: the same whether its Job was just created or seen."""
    if policy.suspend:
        return "Suspended", "suspended by runPolicy.suspend"
    return "Queued", f"waiting for Kueue to admit it from queue {policy.queue_name}"


def action(policy: RunPolicy, job: JobView) -> Action | None:
    """Flip the running Job's suspend flag to what the policy says (Kueue owns queued Jobs)."""
    if job.complete or job.failed:
        return None
    if policy.suspend and not job.suspended:
        return SetJobSuspend(True)
    if not policy.suspend and job.suspended and not policy.queue_name:
        return SetJobSuspend(False)
    return None


def is_suspended(policy: RunPolicy, job: JobView) -> bool:
    if job.complete or job.failed:
        return False
    return policy.suspend or (job.suspended and bool(policy.queue_name))
