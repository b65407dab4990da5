"""Parsing a manifest into a DiffusionJob, and every problem with it named by its field.

`parse_job` is the one entry point used by `muralist validate`, `muralist render`,
`muralist run` and the operator. Pydantic's errors are rewritten as one line per problem,
each starting with the field path; the rules across the spec's sections (job.py's
`spec_problems`, run by the spec's validator) say theirs the same way, taking their facts and
messages from the rules catalog, which the runtime uses too.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from muralist_api.base import member_path, shown
from muralist_api.job import API_VERSION, CROSS_FIELD_RULES, KIND, DiffusionJob, name_problem


class ValidationProblem(Exception):
    """A manifest that is not a valid DiffusionJob; `problems` each name a field, one line each."""

    def __init__(self, problems: list[str]):
        problems = [one_line(p) for p in problems]
        super().__init__("\n".join(problems))
        self.problems = problems


def one_line(text: str) -> str:
    """`text` with its line breaks escaped: a key or value with a newline (or U+2028) in it must
    not split a problem in two, nor forge a line that names another field."""
    lines = text.splitlines()
    return text if len(lines) <= 1 else "\\n".join(lines)


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("str", "PromptSpec") or item.startswith(("function-", "union[")):
            continue  # pydantic's union-branch markers are noise for a user
        elif item == "[key]":  # pydantic's mark of a bad map key
            parts.append(("." if parts else "") + item)
        else:  # a key the user made up is quoted, so that dots, spaces or newlines in it stay readable
            parts = [member_path("".join(parts), item)]
    return "".join(parts)


def _describe_error(err: dict[str, Any]) -> list[str]:
    path = _loc_to_path(err["loc"])
    msg: str = err["msg"]
    if err["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
        if msg.startswith(("spec.", "metadata.")):
            return msg.split("\n")
        return [f"{path}: {msg}"]
    if err["type"] == "extra_forbidden":
        parent = _loc_to_path(err["loc"][:-1])
        return [f"{path}: unknown field; check its spelling against `kubectl explain dj.{parent}`"]
    if err["type"] == "missing":
        return [f"{path}: required field is missing"]
    if err["type"] in ("literal_error", "enum"):
        return [f"{path}: got {shown(err.get('input'))}; {msg.lower()}"]
    got = err.get("input")
    if got is not None and not isinstance(got, dict | list):
        return [f"{path}: {msg} (got {shown(got)})"]
    return [f"{path}: {msg}"]


def problems_from(error: ValidationError) -> list[str]:
    """Pydantic errors as one line per problem, each starting with its field path."""
    out: list[str] = []
    for err in error.errors(include_url=False):
        for line in _describe_error(dict(err)):
            if line not in out:
                out.append(line)
    return out


def parse_job(manifest: Any, cross_field_rules: bool = True) -> DiffusionJob:
    """Validate a manifest (a dict from YAML) or raise ValidationProblem naming every field.
    `cross_field_rules=False` checks each field alone (the operator reading a job admitted under older
    rules: operator/muralist_operator/skew.py)."""
    if not isinstance(manifest, dict):
        raise ValidationProblem([f"manifest: expected a mapping, got {type(manifest).__name__}"])
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        raise ValidationProblem(
            [
                f"apiVersion/kind: got {shown(manifest.get('apiVersion'))}/{shown(manifest.get('kind'))}; "
                f"expected {API_VERSION}/{KIND}"
            ]
        )
    problems: list[str] = []
    name = _mapping(manifest.get("metadata")).get("name")
    nodes = _mapping(_mapping(manifest.get("spec")).get("parallelism")).get("nodes", 1)
    if isinstance(name, str):
        problem = name_problem(name, nodes if isinstance(nodes, int) and nodes >= 1 else 1)
        if problem:
            problems.append(problem)
    try:
        job = DiffusionJob.model_validate(manifest, context={CROSS_FIELD_RULES: cross_field_rules})
    except ValidationError as e:
        problems.extend(problems_from(e))
        raise ValidationProblem(problems) from None
    if problems:
        raise ValidationProblem(problems)
    return job


def _mapping(value: Any) -> dict[str, Any]:
    """A section read before validation: not a mapping reads as empty (validation names it)."""
    return value if isinstance(value, dict) else {}
