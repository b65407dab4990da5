"""The resume contract: when a run may keep the outputs already on its volume.

A restarted pod group, or the same manifest run again, keeps an item its output folder already
holds only when that item was made for exactly the same request. So each item's record carries a
request digest (`requestDigest`, `request_digest`) of everything that decides its pixels: the
model and its revision, dtype, pipeline and adapters; the generation settings; and the item's own
prompt, negative prompt, seed, strength and the bytes of its input images (by their SHA-256). A
run keeps an item whose digest matches and renders again one whose does not (a corrected prompt, an
edited data-set row, another seed, a replaced input photo, another model or step count).

The digest must survive upgrades: an operator or runtime upgrade in the middle of a job adds
fields with defaults, and an unchanged manifest must still resume. So the digest
- covers only what changes pixels (not batchSize, compile, the layout or the output location),
- leaves out every field at its default, so a field added later does not enter it until a
  manifest sets it, and
- is versioned: `r1:` starts every request digest; the job file's `specDigest` (the job-wide part,
  `spec_digest`, versioned by `digestVersion`) is kept for the items of older versions, whose records
  carry no request digest: such an item is kept when the folder's job-wide digest matches and its
  record names the same prompt, negative prompt, seed, strength and input paths (`legacy_match`).

A folder belongs to one job (its job file's namespace and name): another job's folder is refused
unless the manifest shares it (spec.output.shared); the same job deleted and applied again is the
same job, and resumes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from muralist_api.contract.output_folder import JobRecord
from muralist_api.items import Item
from muralist_api.job import DiffusionJobSpec, Generation, ModelSpec

DIGEST_VERSION = 2
REQUEST_DIGEST_PREFIX = "r1:"
# What decides an item's pixels besides the settings every item shares (a row's own seed makes the base
# seed and the images per prompt irrelevant to it: the item's seed says what they would).
ITEM_GENERATION_EXCLUDED = frozenset({"seed", "images_per_prompt"})
# Of spec.model: what selects the weights and their precision, and the LoRA adapters on top
# (fuseAdapters moves pixels by rounding only, ~4e-7).
PIXEL_MODEL_FIELDS = frozenset({"name", "revision", "dtype", "pipeline", "adapters"})
# Of spec.generation: everything but what only changes speed.
SPEED_ONLY_GENERATION_FIELDS = frozenset({"batch_size", "compile"})


def pixel_parameters(model: ModelSpec, generation: Generation) -> dict[str, Any]:
    return {
        "model": model.model_dump(mode="json", include=set(PIXEL_MODEL_FIELDS), exclude_defaults=True),
        "generation": generation.model_dump(mode="json", exclude=set(SPEED_ONLY_GENERATION_FIELDS),
                                            exclude_defaults=True),
    }


def _digest(parameters: dict[str, Any]) -> str:
    doc = {"version": DIGEST_VERSION, **parameters}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def spec_digest(spec: DiffusionJobSpec) -> str:
    """Identifies the parameters that decide an image's pixels."""
    return _digest(pixel_parameters(spec.model, spec.generation))


def recorded_digest(record: JobRecord) -> str | None:
    """The digest of the outputs described by a job file, in this version's terms.

    None when it cannot be told: a job file of a newer version whose spec has fields this one
    does not know (they may change pixels), or one that records no spec.
    """
    if record.digest_version == DIGEST_VERSION:
        return record.spec_digest
    spec = (record.spec or {}).get("spec")
    if not isinstance(spec, dict):
        return None
    try:
        model = ModelSpec.model_validate(spec.get("model") or {})
        generation = Generation.model_validate(spec.get("generation") or {})
    except ValidationError:
        return None
    return _digest(pixel_parameters(model, generation))


def mismatch(record: JobRecord, spec: DiffusionJobSpec) -> str | None:
    """Why outputs described by a job file cannot be kept by a job with `spec`; None if they can."""
    old, new = recorded_digest(record), spec_digest(spec)
    if old == new:
        return None
    if old is None:
        return (f"was written by another Muralist version whose parameters this one cannot compare "
                f"(this job {new})")
    return f"holds images of a job with other model/generation parameters (digest {old}, this job {new})"


def request_digest(spec: DiffusionJobSpec, item: Item, input_shas: Mapping[str, str]) -> str:
    """What decides one item's pixels, digested: the model, the generation settings and the item's
    own fields; `input_shas`: the SHA-256 (hex) of the bytes of each input it has ("image", "mask")."""
    generation = spec.generation.model_dump(
        mode="json", exclude=set(SPEED_ONLY_GENERATION_FIELDS | ITEM_GENERATION_EXCLUDED), exclude_defaults=True)
    own = {"prompt": item.prompt, "negativePrompt": item.negative_prompt, "seed": item.seed,
           "strength": item.strength, "height": item.height, "width": item.width, "numFrames": item.num_frames,
           **{f"{name}Sha256": sha for name, sha in sorted(input_shas.items())}}
    doc = {"model": spec.model.model_dump(mode="json", include=set(PIXEL_MODEL_FIELDS), exclude_defaults=True),
           "generation": generation, "item": {k: v for k, v in own.items() if v is not None}}
    # ensure_ascii: a prompt's lone surrogate is digested as its escape, not refused.
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return REQUEST_DIGEST_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]


LEGACY_FIELDS = {"prompt": "prompt", "negativePrompt": "negative_prompt", "seed": "seed", "strength": "strength"}


def changed_fields(entry: Mapping[str, Any], item: Item) -> list[str]:
    """What a record says its item was made with and the item now asks otherwise (for people: the
    digest decides). The fields of the record that name the item's own request."""
    changed = [name for name, attr in LEGACY_FIELDS.items() if entry.get(name) != getattr(item, attr)]
    for name, field in (("inputImage", "image"), ("inputMask", "mask")):
        value = getattr(item, field)
        if isinstance(value, str) and entry.get(name) not in (None, value):
            changed.append(name)
    return changed


def legacy_match(entry: Mapping[str, Any], item: Item) -> bool:
    """Whether an item's record of a version before request digests names this item's request (its
    folder's job-wide digest matched): the same text, seed and strength, and the same input paths."""
    if changed_fields(entry, item):
        return False
    return all(entry.get(name) == getattr(item, field) for name, field in (("inputImage", "image"),
                                                                           ("inputMask", "mask"))
               if isinstance(getattr(item, field), str))


def other_job(record: JobRecord, namespace: str, name: str) -> str | None:
    """The namespace/name of the job that wrote a folder when it is not this one; None when it is (or the
    folder does not say)."""
    if record.name is None or (record.namespace or "default", record.name) == (namespace, name):
        return None
    return f"{record.namespace or 'default'}/{record.name}"
