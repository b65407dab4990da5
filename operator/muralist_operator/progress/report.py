"""The body a pod posts (the wire contract), parsed into a PodReport.

    {"pod": "cats-3-x7k2q", "index": 3, "attempt": 0, "ranks": 8,
     "completed": 12, "skipped": 4, "failed": 0, "total": 400,
     "lastStepTime": "2026-12-01T12:00:00Z", "lastImageTime": "2026-12-01T11:59:58Z",
     "sentAt": "2026-12-01T12:00:01Z", "final": false, "done": false}

Counts are this pod's (all its ranks), cumulative for its attempt; `total` is the job's item
count, the same from every pod; `attempt` is MURALIST_ATTEMPT (the index's failures before
this pod); `final` marks the pod's last post, `done` that its ranks have finished their work.

Parsing is strict about what is there (types, signs, timestamps with a zone: a bad value is
refused with the field's name, so a runtime bug shows up as a 400 with its reason) and lenient
about what is not known: extra keys are ignored, because the runtime image of a job may be newer
than the operator that watches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

# The first local rank of a pod posts this often unless a response says otherwise (a 204 means
# "keep the default"; a 200 carries {"intervalSeconds": N}). The runtime mirrors this constant.
DEFAULT_POST_INTERVAL_SECONDS = 3
COUNT_FIELDS = ("attempt", "ranks", "completed", "skipped", "failed", "total")
MAX_POD_NAME = 253


class ReportError(ValueError):
    """A malformed body; the message names the field and is sent back in the 400."""


@dataclass(frozen=True)
class PodReport:
    """One pod's cumulative counts for one attempt (a lost post loses nothing)."""

    pod: str
    index: int
    attempt: int
    ranks: int
    completed: int
    skipped: int
    failed: int
    total: int
    last_step_time: datetime | None
    last_image_time: datetime | None
    sent_at: datetime
    final: bool
    # The wire's `done`: this pod's ranks have no more work (claimed items all finished); its
    # silence from here on is no stall. Optional: older runtimes do not send it.
    finished: bool = False

    @property
    def done(self) -> int:
        """Items that need no more work: rendered now, or found on disk from an earlier attempt."""
        return self.completed + self.skipped

    @property
    def progress_time(self) -> datetime | None:
        """The last sign of progress (a step or an image), not mere liveness: a rank stuck in a
        collective keeps posting but stops stepping."""
        return max(filter(None, (self.last_step_time, self.last_image_time)), default=None)


def _int(doc: dict[str, Any], key: str, minimum: int = 0) -> int:
    value = doc.get(key)
    # bool is an int subclass: `true` for a count is a bug in the sender, not a 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ReportError(f"{key} must be an integer, not {value!r}")
    if value < minimum:
        raise ReportError(f"{key} must be >= {minimum}, not {value}")
    return value


def _time(doc: dict[str, Any], key: str, required: bool) -> datetime | None:
    value = doc.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ReportError(f"{key} must be an RFC 3339 time{'' if required else ' or null'}, not {value!r}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ReportError(f"{key} is not an RFC 3339 time: {value!r}") from None
    if moment.tzinfo is None:
        raise ReportError(f"{key} needs a time zone (Z or an offset): {value!r}")
    return moment


def parse_report(doc: Any) -> PodReport:
    """Validate a decoded JSON body; raises ReportError naming the first bad field."""
    if not isinstance(doc, dict):
        raise ReportError(f"the body must be a JSON object, not {type(doc).__name__}")
    missing = [k for k in ("pod", "index", *COUNT_FIELDS, "sentAt", "final") if k not in doc]
    if missing:
        raise ReportError(f"missing field(s): {', '.join(missing)}")
    pod = doc["pod"]
    if not isinstance(pod, str) or not pod or len(pod) > MAX_POD_NAME:
        raise ReportError(f"pod must be a pod name, not {pod!r}")
    final = doc["final"]
    if not isinstance(final, bool):
        raise ReportError(f"final must be true or false, not {final!r}")
    done = doc.get("done", False)
    if not isinstance(done, bool):
        raise ReportError(f"done must be true or false, not {done!r}")
    counts = {k: _int(doc, k, minimum=1 if k == "ranks" else 0) for k in COUNT_FIELDS}
    return PodReport(
        pod=pod,
        index=_int(doc, "index"),
        **counts,
        last_step_time=_time(doc, "lastStepTime", required=False),
        last_image_time=_time(doc, "lastImageTime", required=False),
        sent_at=_time(doc, "sentAt", required=True),  # type: ignore[arg-type]  # required: never None
        final=final,
        finished=done,
    )
