"""What following a job can end in besides success: the job failed, the wait ran out, the job went away."""

from __future__ import annotations

from muralist_api.status import DiffusionJobStatus


class JobFailed(RuntimeError):
    """The job reached phase Failed: `message` is its status.message, `failed_indexes` the
    completion indexes whose pods failed (status.indexes), `status` the whole final status."""

    def __init__(self, name: str, status: DiffusionJobStatus):
        self.name, self.status = name, status
        self.message = status.message
        self.failed_indexes = [entry.index for entry in status.indexes]
        indexes = f" (failed indexes: {', '.join(map(str, self.failed_indexes))})" if self.failed_indexes else ""
        super().__init__(f"DiffusionJob {name} failed: {self.message or 'no message'}{indexes}")


class WaitTimeout(TimeoutError):
    """The job was still running when the wait's timeout passed; `last_status` is what was seen last."""

    def __init__(self, name: str, timeout: float, last_status: DiffusionJobStatus):
        self.name, self.timeout, self.last_status = name, timeout, last_status
        progress = last_status.progress
        seen = f"phase {last_status.phase}"
        if progress.total:
            seen += f", {progress.completed + progress.failed}/{progress.total} images"
        if progress.eta:
            seen += f", ETA {progress.eta}"
        super().__init__(f"DiffusionJob {name} did not finish within {timeout:g}s; last seen: {seen}")


class JobDeleted(LookupError):
    """The job was deleted while it was followed (or before it finished)."""

    def __init__(self, name: str, last_status: DiffusionJobStatus):
        self.name, self.last_status = name, last_status
        super().__init__(f"DiffusionJob {name} was deleted before it finished (last phase {last_status.phase})")
