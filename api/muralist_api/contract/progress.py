"""The progress wire: the report a pod posts to the operator, where, with which token, how often.

The pod's first local rank sums its ranks' counts and POSTs one `ProgressReport` as JSON
to `progress_url(...)` (the path `PROGRESS_PATH`), with a projected service-account token of
audience `PROGRESS_AUDIENCE`, every `DEFAULT_POST_INTERVAL_SECONDS` unless the answer names
another interval (a 204 means "keep the default"; a 200 carries {"intervalSeconds": N}):

    {"pod": "cats-3-x7k2q", "index": 3, "attempt": 0, "ranks": 8,
     "completed": 12, "skipped": 4, "failed": 0, "total": 400,
     "lastStepTime": "2026-12-01T12:00:00Z", "lastImageTime": "2026-12-01T11:59:58Z",
     "sentAt": "2026-12-01T12:00:01Z", "final": false, "done": false}

The runtime builds the model and sends `report.to_wire()`; the operator reads a body with
`ProgressReport.from_wire` (the one parser), which is strict about what is there (types,
signs, timestamps with a zone: a bad value is refused with the field's name, so a runtime bug
shows up as a 400 with its reason) and lenient about what is not known: extra keys are
ignored, because the runtime image of a job may be newer than the operator that watches it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

# One line per finished image on a pod's stdout, for log-based tooling.
PROGRESS_LINE_PREFIX = "MURALIST_PROGRESS "

# -- the endpoint (the operator's HTTPS Service) -------------------------------------------------
PROGRESS_PATH = "/v1/namespaces/{namespace}/diffusionjobs/{job}/progress"
PROGRESS_AUDIENCE = "muralist.dev"  # of the pods' projected service-account token
PROGRESS_TOKEN_DIR = "/var/run/secrets/muralist.dev/progress"
PROGRESS_TOKEN_FILE = f"{PROGRESS_TOKEN_DIR}/token"
PROGRESS_TOKEN_SECONDS = 600  # the shortest expiry the API server accepts; the kubelet rotates it
PROGRESS_CA_KEY = "progress-ca.crt"  # a key of the spec ConfigMap, mounted beside the spec
# How often a pod posts unless the operator's answer asks for another interval.
DEFAULT_POST_INTERVAL_SECONDS = 3
MAX_POD_NAME = 253


def progress_url(base: str, namespace: str, job: str) -> str:
    """Where the pods of one job post: the operator's progress Service (`https://svc.ns.svc:port`)."""
    return base.rstrip("/") + PROGRESS_PATH.format(namespace=namespace, job=job)


def parse_progress_path(path: str) -> tuple[str, str] | None:
    """(namespace, job) of a path made by PROGRESS_PATH; None for any other path."""
    parts = path.split("/")
    template = PROGRESS_PATH.split("/")
    if len(parts) != len(template):
        return None
    found: dict[str, str] = {}
    for part, expected in zip(parts, template, strict=True):
        if expected.startswith("{"):
            if not part:
                return None
            found[expected.strip("{}")] = part
        elif part != expected:
            return None
    return found["namespace"], found["job"]


# -- the report ------------------------------------------------------------------------------------

_Count = Annotated[int, Field(ge=0)]


class ReportError(ValueError):
    """A malformed body; the message names the field and is sent back in the 400."""


class ProgressReport(BaseModel):
    """One pod's cumulative counts for one attempt (a lost post loses nothing).

    Counts are this pod's (all its ranks); `total` is the job's item count, the same from every
    pod; `attempt` is MURALIST_ATTEMPT (the index's failures before this pod); `final` marks
    the pod's last post.
    """

    # strict: a count of `true` or "3" is a bug in the sender, not a 1 or a 3 (parsed from JSON,
    # a strict time is still an RFC 3339 string).
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True,
                              strict=True)

    pod: str = Field(min_length=1, max_length=MAX_POD_NAME)
    index: _Count
    attempt: _Count
    ranks: int = Field(ge=1)
    completed: _Count
    skipped: _Count
    failed: _Count
    total: _Count
    # Of `completed`, the items that replaced an output made before for another request. Optional: older
    # runtimes do not send it.
    rerendered: _Count = 0
    last_step_time: AwareDatetime | None = None
    last_image_time: AwareDatetime | None = None
    sent_at: AwareDatetime
    final: bool
    # The wire's `done`: this pod's ranks have no more work (claimed items all finished), or wait
    # for work that may never come (the first pod's ranks, for chunks handed back at the end); its
    # silence from here on is no stall. Optional: older runtimes do not send it.
    finished: bool = Field(default=False, alias="done")

    @property
    def items_done(self) -> int:
        """Items that need no more work: rendered now, or found on disk from an earlier attempt."""
        return self.completed + self.skipped

    @property
    def progress_time(self) -> datetime | None:
        """The last sign of progress (a step or an image), not mere liveness: a rank stuck in a
        collective keeps posting but stops stepping."""
        return max(filter(None, (self.last_step_time, self.last_image_time)), default=None)

    def to_wire(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_wire(cls, body: bytes | str) -> ProgressReport:
        """Validate a posted body; raises ReportError naming the first bad field."""
        try:
            return cls.model_validate_json(body)
        except ValidationError as e:
            raise ReportError(_explain(e)) from None


def _explain(error: ValidationError) -> str:
    """The first problem of a refused body, in the words of the 400 (missing fields all at once)."""
    problems = error.errors(include_url=False)
    missing = [str(p["loc"][0]) for p in problems if p["type"] == "missing" and p["loc"]]
    if missing:
        return f"missing field(s): {', '.join(missing)}"
    first = problems[0]
    kind, value, context = first["type"], first.get("input"), first.get("ctx") or {}
    if kind == "json_invalid":
        return f"the body is not JSON: {context.get('error', first['msg'])}"
    if not first["loc"]:  # the body itself
        return f"the body must be a JSON object, not {type(value).__name__}"
    name = str(first["loc"][0])
    if name == "pod":
        return f"pod must be a pod name, not {value!r}"
    if kind == "bool_type":
        return f"{name} must be true or false, not {value!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{name} must be an integer, not {value!r}"
    if kind == "greater_than_equal":
        return f"{name} must be >= {context.get('ge')}, not {value}"
    if kind == "timezone_aware":
        return f"{name} needs a time zone (Z or an offset): {value!r}"
    if kind == "datetime_type":
        optional = ProgressReport.model_fields[_field(name)].is_required() is False
        return f"{name} must be an RFC 3339 time{' or null' if optional else ''}, not {value!r}"
    if kind.startswith(("datetime_", "date_")):
        return f"{name} is not an RFC 3339 time: {value!r}"
    return f"{name}: {first['msg']}"


def _field(alias: str) -> str:
    return next(n for n, f in ProgressReport.model_fields.items() if f.alias == alias)

