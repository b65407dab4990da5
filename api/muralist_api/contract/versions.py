"""Which versions of Muralist work together, and how each part reads what a newer one wrote.

The skew policy (docs/concepts/versions.md says it for people who run Muralist):

- The operator of a release runs the runtime images of its own release and of the release before
  (N and N-1): a job pinned to an older image (`spec.image`) keeps working across an operator upgrade.
- The CRD may be applied before or after the operator is upgraded (or rolled back): an operator of
  release N or N-1 runs every job stored under the CRD of either release, running ones included.
- Until the repository has release tags, "the release before" is a recorded commit: `SKEW_BASELINE`
  in hack/versions.env (the skew tests extract its api/, operator/ and runtime/ from git and run them
  against this tree's; moving it is one line there, at each release).

How each reader keeps that true:

- **The runtime spec** (`runtime_spec.py`, what the operator writes into the `<job>-spec` ConfigMap)
  holds only what differs from its default: a field left out means its default. So a field added
  after an image was built reaches that image only when a job sets it, and then the job uses
  something the image lacks: the image refuses it by name, with exit 78
  (`runtime_spec.read_runtime_spec`). A field the image does not know whose value is null (unset) is ignored.
- **The operator** reads a DiffusionJob stored under a newer CRD (operator/muralist_operator/skew.py):
  fields it does not know never fail a job; a job that runs goes on without them, one that has not
  started waits for an operator that knows them. A status it cannot parse is kept and reported,
  never reset.
- **The CRD** defaults only fields the baseline's operator knows (operator/muralist_operator/crd.py):
  the API server fills a CRD default into every stored object it returns, and an older operator
  refuses a field it does not know; a field added later is defaulted by pydantic alone.

Every API model still refuses unknown fields (base.ApiModel): admission and `muralist validate`
name a typo; only these readers of objects written by another version set them aside first.
"""

from __future__ import annotations

import copy
import subprocess
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class UnknownField:
    """A field of an object that the model reading it does not know: where, and what it held."""

    path: str  # spec.runPolicy.startTimeoutSeconds, spec.prompts[3].weight
    value: Any


def unknown_fields(model: type[BaseModel], data: Any) -> tuple[Any, list[UnknownField]]:
    """`data` without the fields `model` does not know (a copy; `data` itself when there are none),
    and those fields. Pydantic's own errors find them (every API model forbids extra fields), so a
    union (a prompt is a string or an object) is read as the model reads it."""
    try:
        model.model_validate(data)
        return data, []
    except ValidationError as e:
        extra = [err["loc"] for err in e.errors(include_url=False) if err["type"] == "extra_forbidden"]
    if not extra:
        return data, []
    known = copy.deepcopy(data)
    found: list[UnknownField] = []
    for loc in extra:
        removed = _remove(known, loc)
        if removed is not None and removed.path not in {f.path for f in found}:
            found.append(removed)
    return known, found


def _remove(data: Any, loc: tuple[int | str, ...]) -> UnknownField | None:
    """Remove what `loc` points at; pydantic's marks of a union branch ("str", "Prompt") are steps
    that name no key of the data, and are passed over."""
    node, path = data, ""
    for step in loc[:-1]:
        if isinstance(node, dict) and step in node:
            node, path = node[step], f"{path}.{step}" if path else str(step)
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            node, path = node[step], f"{path}[{step}]"
    name = loc[-1]
    if not isinstance(node, dict) or name not in node:
        return None
    return UnknownField(f"{path}.{name}" if path else str(name), node.pop(name))


@cache
def build() -> str:
    """This copy of Muralist, for messages: its version, and its commit when it runs from a clone."""
    try:
        version = metadata.version("muralist-api")
    except metadata.PackageNotFoundError:
        version = "unknown version"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"muralist {version}" + (f" at {commit}" if commit else "")


def runtime_lacks() -> str:
    """Why a runtime image refuses a field it does not know (its message, after the field's path)."""
    return (f"not supported by this runtime image ({build()}): the operator that wrote the spec is newer; "
            "run the job on an image of the operator's release (spec.image, or the operator's --runtime-image), "
            "or remove the field")


def operator_lacks(fields: list[UnknownField]) -> str:
    """What an operator says of the spec fields it does not know."""
    names = ", ".join(f.path for f in fields)
    return (f"{names}: not known to this operator ({build()}): the CRD is newer than the operator; "
            "upgrade the operator (docs/concepts/versions.md)")
