"""Whether an item on disk is the one this job asks for: its record's request digest against the item's.

The rule is the resume contract's (muralist_api/contract/resume.py); this module applies it to the
records a folder holds. An item's record (its JSON, its part-file line) carries `requestDigest` and,
for items with input images, `inputs: {image: {sha256, stamp}}`. A record of a version before request
digests is kept when the folder's job-wide digest matched and the record names the same request
(`legacy_match`): `FolderTrust.legacy` says whether it did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from muralist_api.contract import resume
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec

from ..work import inputs
from ..work.inputs import InputError


@dataclass(frozen=True)
class FolderTrust:
    """What the folder's job file said at the start: whether records without a request digest (of an
    older version) may be kept by what they name (the job-wide digest matched, and the folder is this job's)."""

    legacy: bool = True


TRUSTED = FolderTrust()


def record(runtime: RuntimeSpec, item: Item) -> dict[str, Any]:
    """The fields an item's record gets for its request: `requestDigest`, and `inputs` when it has some.
    Its inputs were just read to render it: their SHA-256 is remembered (no second read)."""
    shas = inputs.shas(runtime, item)
    out: dict[str, Any] = {"requestDigest": resume.request_digest(runtime.spec, item,
                                                                  {f: s.sha256 for f, s in shas.items()})}
    if shas:
        out["inputs"] = {f: s.to_json() for f, s in shas.items()}
    return out


def changed(runtime: RuntimeSpec, item: Item, entry: Mapping[str, Any], trust: FolderTrust) -> list[str] | None:
    """None when the record on disk is this item's request (keep it); else what changed, for its new record
    (the fields that differ, or "request" when only the digest says so: the model, a setting, an input's
    bytes)."""
    digest = entry.get("requestDigest")
    if not isinstance(digest, str):  # a record of a version before request digests
        if trust.legacy and resume.legacy_match(entry, item):
            return None
        return resume.changed_fields(entry, item) or ["request"]
    try:
        shas = inputs.shas(runtime, item, entry.get("inputs") if isinstance(entry.get("inputs"), dict) else None)
    except InputError:
        return ["inputs"]  # rendered again: its own failure will name the input
    if resume.request_digest(runtime.spec, item, {f: s.sha256 for f, s in shas.items()}) == digest:
        return None
    return resume.changed_fields(entry, item) or _changed_inputs(entry, shas) or ["request"]


def _changed_inputs(entry: Mapping[str, Any], shas: Mapping[str, inputs.InputSha]) -> list[str]:
    found = entry.get("inputs")
    before: dict[str, Any] = found if isinstance(found, dict) else {}
    return [f"inputs.{field}" for field, sha in shas.items()
            if not isinstance(before.get(field), dict) or before[field].get("sha256") != sha.sha256]
