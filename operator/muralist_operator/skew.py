"""A DiffusionJob that a newer Muralist wrote: what the reconciler does with what it does not know.

The skew policy is api/muralist_api/contract/versions.py's. Under a newer CRD (applied before this
operator was upgraded, or kept after it was rolled back) a stored object can hold fields this operator
does not know, and after a rollback the status can hold what a newer operator wrote. Nothing of that
fails a job, and nothing is reset:

- `read_status`: fields of the status this operator does not know are set aside (the status write is a
  merge patch, so they stay in the object) and named in the VersionSkew condition. A status it cannot
  parse at all (a phase it does not know, a value of another type) is kept as it is: the reconcile stops
  before deciding anything, and a Warning event says what does not parse.
- `read_job`: spec fields this operator does not know. A job that has started goes on without them (its
  children were made by the operator that knew them), with the VersionSkew condition naming them; a job
  that has not started (or is no valid job without them) is left as it is, saying what it waits for,
  until an operator that knows them runs it (`wait_for_operator`). Only an operator that knows every
  field of a spec creates its children.
- `read_admitted`: a job that has started and that this operator's cross-field rules refuse (a rule added
  since it was admitted: spec.output of several pods on an emptyDir, a key of extraArgs) goes on as it
  was admitted, each field checked alone, with the VersionSkew condition naming what the rules say: an
  upgrade never fails a running job. A new job of that spec is refused.

Pure functions; the reconciler calls them and writes what they return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from muralist_api.contract.versions import UnknownField, build, operator_lacks, unknown_fields
from muralist_api.job import DiffusionJob
from muralist_api.rules.problems import ValidationProblem, parse_job, problems_from
from muralist_api.status import DiffusionJobStatus
from pydantic import ValidationError

from muralist_operator.decision import Decision, Event, Transition, find_condition, set_condition

CONDITION = "VersionSkew"
REASON_UNKNOWN_FIELDS = "UnknownFields"
REASON_STATUS_UNREADABLE = "StatusUnreadable"
REASON_RULES_CHANGED = "RulesChanged"


@dataclass(frozen=True)
class StatusReading:
    """The status as far as this operator can read it. `status` None: it cannot (`problems` say why),
    and it is kept as it is."""

    status: DiffusionJobStatus | None
    known: dict[str, Any]  # the status without the fields set aside: what a status write compares with
    unknown: list[UnknownField] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_status(raw: dict[str, Any]) -> StatusReading:
    try:
        return StatusReading(DiffusionJobStatus.model_validate(raw), raw)
    except ValidationError:
        pass
    known, unknown = unknown_fields(DiffusionJobStatus, raw)
    unknown = [UnknownField(f"status.{f.path}", f.value) for f in unknown]
    try:
        return StatusReading(DiffusionJobStatus.model_validate(known), known, unknown)
    except ValidationError as e:
        problems = [f"status.{p}" for p in problems_from(e)]
        return StatusReading(None, raw, unknown, problems)


def unreadable_message(reading: StatusReading) -> str:
    return (f"{'; '.join(reading.problems)}: this operator ({build()}) cannot read the job's status (a newer "
            "operator wrote it?); it is kept as it is and the job is left alone until an operator that reads it "
            "runs (docs/concepts/versions.md)")[:2000]


class NewerSpec(Exception):
    """A job not started yet whose spec has fields this operator does not know."""

    def __init__(self, fields: list[UnknownField]):
        super().__init__(operator_lacks(fields))
        self.fields = fields


def read_job(manifest: Any, started: bool) -> tuple[DiffusionJob, list[UnknownField]]:
    """The job, and the spec fields set aside because this operator does not know them (only for a job
    that has `started`; one that has not raises NewerSpec). Any other problem raises ValidationProblem,
    as parse_job does."""
    try:
        return parse_job(manifest), []
    except ValidationProblem:
        known, unknown = unknown_fields(DiffusionJob, manifest)
        if not unknown:
            raise
    try:
        job = parse_job(known)
    except ValidationProblem:  # what it knows is not a job without the rest (a newer source of prompts)
        raise NewerSpec(unknown) from None
    if not started:
        raise NewerSpec(unknown)
    return job, unknown


def read_admitted(manifest: Any, started: bool, refused: ValidationProblem) -> tuple[DiffusionJob, list[str]]:
    """A started job that this operator's cross-field rules refuse, read with each field checked alone,
    and what the rules say; `refused` is raised again when the job has not started or is no job even so."""
    if not started:
        raise refused
    try:
        return parse_job(manifest, cross_field_rules=False), refused.problems
    except ValidationProblem:
        raise refused from None


def note_unknown(decision: Decision, unknown: list[UnknownField], now: datetime, generation: int | None,
                 rules: list[str] | None = None) -> None:
    """The VersionSkew condition names the fields set aside and the rules a running job was admitted
    without (with an event when that changes); it goes once there are none."""
    conditions = decision.status.conditions
    if not unknown and not rules:
        decision.status.conditions = [c for c in conditions if c.type != CONDITION]
        return
    said = [operator_lacks(unknown) + "; the job goes on without them"] if unknown else []
    if rules:
        said.append(f"this operator's rules refuse the spec ({'; '.join(rules)}); it was admitted before them and "
                    "goes on as it is, a new job like it would be refused")
    message = "; ".join(said)[:2000]
    reason = REASON_UNKNOWN_FIELDS if unknown else REASON_RULES_CHANGED
    existing = find_condition(conditions, CONDITION)
    if existing is None or existing.message != message:
        decision.events.append(Event("Warning", reason, message))
    set_condition(conditions, CONDITION, True, reason, message, now, generation)


def wait_for_operator(status: DiffusionJobStatus, generation: int | None, newer: NewerSpec, now: datetime) -> Decision:
    """A job whose spec this operator only partly knows and that it cannot run without the rest (not
    started yet, or not a valid job without those fields): nothing is created or deleted, and status
    says what it waits for, until an operator that knows those fields runs it."""
    t = Transition(status, generation, now)
    message = f"{newer}; until one runs, this operator leaves the job as it is"
    if t.status.message != message:
        t.event("Warning", REASON_UNKNOWN_FIELDS, message)
    t.status.message = message
    t.condition(CONDITION, True, REASON_UNKNOWN_FIELDS, message)
    return t.decision
