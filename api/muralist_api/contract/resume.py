"""The resume contract: when a run may keep the outputs already on its volume.

A restarted pod group, or the same manifest run again, keeps every image its output folder
already holds, as long as those images were made with the same pixel-deciding parameters.
Those parameters are digested into job.json. The digest must survive upgrades: an operator or
runtime upgrade in the middle of a job adds fields with defaults, and an unchanged manifest
must still resume, not fail permanently. So the digest
- covers only what changes pixels (the model, the sampling parameters; not batchSize, compile,
  the layout or the output location), and
- leaves out every field at its default, so a field added later does not enter it until a
  manifest sets it, and
- is versioned: a job.json of an older format is re-digested from the spec it recorded.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import ValidationError

from muralist_api.job import DiffusionJobSpec, Generation, ModelSpec

DIGEST_VERSION = 2
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


def recorded_digest(job_json: dict[str, Any]) -> str | None:
    """The digest of the outputs described by a job.json, in this version's terms.

    None when it cannot be told: a job.json of a newer version whose spec has fields this one
    does not know (they may change pixels), or one that is not a job.json at all.
    """
    if job_json.get("digestVersion") == DIGEST_VERSION:
        digest = job_json.get("specDigest")
        return digest if isinstance(digest, str) else None
    spec = (job_json.get("spec") or {}).get("spec")
    if not isinstance(spec, dict):
        return None
    try:
        model = ModelSpec.model_validate(spec.get("model") or {})
        generation = Generation.model_validate(spec.get("generation") or {})
    except ValidationError:
        return None
    return _digest(pixel_parameters(model, generation))


def mismatch(job_json: dict[str, Any], spec: DiffusionJobSpec) -> str | None:
    """Why outputs described by `job_json` cannot be kept by a job with `spec`; None if they can."""
    old, new = recorded_digest(job_json), spec_digest(spec)
    if old == new:
        return None
    if old is None:
        return (f"was written by another Muralist version whose parameters this one cannot compare "
                f"(this job {new})")
    return f"holds images of a job with other model/generation parameters (digest {old}, this job {new})"
