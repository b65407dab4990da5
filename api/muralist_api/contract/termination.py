"""The end of a runtime process: exit codes, the permanent-failure verdict, the termination message.

torchrun replaces a worker's exit code with its own, so the verdict travels twice: in the exit
code (78, sysexits' EX_CONFIG) and in the JSON termination message (`permanent: true`), where
the operator and `muralist run` read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from muralist_api.contract.counts import CheckpointSteps, Counts
from muralist_api.step_cache import CacheSample

# -- exit codes --------------------------------------------------------------------------------
EXIT_OK = 0
EXIT_RETRYABLE = 1
# sysexits' EX_CONFIG: retrying cannot help (a bad model for the layout, no GPU for TP...).
# torchrun replaces a worker's exit code with its own, so the verdict also travels in the
# termination message (`permanent: true`), where the operator and `muralist run` read it.
PERMANENT_FAILURE_EXIT_CODE = 78
# A pod told to stop (SIGTERM: scaled down, preempted, evicted) that drained: it finished or
# abandoned its item in flight and handed its unfinished chunk back. 128 + SIGTERM, what a process
# stopped by SIGTERM shows: not 0, so that an evicted or preempted pod is started again (its
# DisruptionTarget condition keeps that from counting as a failure), while the index of a pod
# removed by a resize is outside its Job, where no exit code counts.
DRAINED_EXIT_CODE = 143
# A test knob's stand-in for a killed pod (MURALIST_TEST_EXIT_AFTER).
TEST_KILLED_EXIT_CODE = 17


class PermanentFailure(Exception):
    """What retrying cannot fix. The runtime exits with PERMANENT_FAILURE_EXIT_CODE and
    `str(self)`: one line that starts with the spec field to change (`items` when failed items
    failed the job and their reasons, named in the line, say what to change)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


# -- the termination message -------------------------------------------------------------------

TERMINATION_MESSAGE_MAX = 4096
Reason = Literal["Completed", "Drained", "Error", "PermanentFailure"]
# Every local rank of a container may write the one termination message: the most severe wins.
SEVERITY: Mapping[str, int] = {"Completed": 0, "Drained": 1, "Error": 2, "PermanentFailure": 3}


@dataclass
class Termination:
    """The JSON summary a runtime process leaves in the termination message (under 4 KiB)."""

    counts: Counts = field(default_factory=Counts)
    exit_code: int = EXIT_OK
    permanent: bool = False
    reason: str = "Completed"
    message: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    cache_sample: CacheSample | None = None  # generation.cache.verify: this pod's share of the sample
    # The whole job's items as the merge found them in the manifest (the first pod's, once it merged):
    # completed = rendered now (rerendered of them in place of another request's), skipped = kept.
    job: Counts | None = None
    # runPolicy.checkpoint: the whole job's steps saved and lost, as the merge found them (with `job`).
    checkpoints: CheckpointSteps | None = None

    def to_json(self) -> str:
        doc: dict[str, Any] = {**asdict(self.counts), "exitCode": self.exit_code, "permanent": self.permanent,
                               "reason": self.reason, "message": self.message}
        if self.job is not None:
            doc["job"] = asdict(self.job)
        if self.checkpoints is not None:
            doc["checkpoints"] = self.checkpoints.to_wire()
        doc.update({k: round(v, 3) for k, v in self.timings.items()})
        if self.cache_sample is not None:
            doc["cacheVerify"] = self.cache_sample.to_wire()
        text = json.dumps(doc)
        over = len(text.encode()) - TERMINATION_MESSAGE_MAX
        if over > 0:
            # Only the message can be long (a traceback's last line, a path): cut it to fit.
            raw = self.message.encode()
            doc["message"] = raw[: max(0, len(raw) - over - 16)].decode(errors="ignore") + "..."
            text = json.dumps(doc)
        return text

    @classmethod
    def parse(cls, text: str) -> Termination | None:
        """The summary in a termination message; None when it is not one (a log tail)."""
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        known = {"completed", "skipped", "failed", "total", "rerendered", "exitCode", "permanent", "reason", "message"}

        def num(key: str) -> int:
            value = doc.get(key, 0)
            return value if isinstance(value, int) else 0

        return cls(
            counts=Counts(num("completed"), num("skipped"), num("failed"), num("total"), num("rerendered")),
            exit_code=num("exitCode"),
            permanent=doc.get("permanent") is True,
            reason=str(doc.get("reason", "")),
            message=str(doc.get("message", "")),
            timings={k: float(v) for k, v in doc.items() if k not in known and isinstance(v, int | float)},
            cache_sample=CacheSample.from_wire(doc.get("cacheVerify")),
            job=_counts(doc.get("job")),
            checkpoints=CheckpointSteps.from_wire(doc.get("checkpoints")),
        )

    @property
    def severity(self) -> int:
        return SEVERITY.get(self.reason, 0)


def _counts(doc: object) -> Counts | None:
    if not isinstance(doc, dict):
        return None
    values = [doc.get(k, 0) for k in ("completed", "skipped", "failed", "total", "rerendered")]
    return Counts(*(v if isinstance(v, int) and not isinstance(v, bool) else 0 for v in values))


def message_severity(text: str) -> int:
    """Severity of a termination message already written; -1 when empty or not ours."""
    parsed = Termination.parse(text) if text.strip() else None
    return parsed.severity if parsed is not None else -1


def is_permanent(exit_code: int, message: str) -> bool:
    """How the operator and the local runner read a finished container."""
    if exit_code == PERMANENT_FAILURE_EXIT_CODE:
        return True
    parsed = Termination.parse(message)
    return parsed is not None and parsed.permanent
