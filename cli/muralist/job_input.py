"""What `Client.create` accepts, turned into the objects to send: checked by `muralist validate`'s rules first.

A job comes as a manifest path, YAML text, a dict (the manifest as `yaml.safe_load` gives it) or
the typed `DiffusionJob`. A path or YAML text may hold ConfigMaps beside the one DiffusionJob
(the prompts of a `promptsFrom`, as in examples/prompts-from-configmap.yaml): they are sent too,
first, so the job finds them. Any other kind is refused: that is kubectl's work. Pure: no API calls.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muralist_api.job import KIND, DiffusionJob
from muralist_api.manifests import ManifestError, read_file
from muralist_api.rules.problems import ValidationProblem, parse_job

JobInput = str | os.PathLike[str] | dict[str, Any] | DiffusionJob

# Beside a DiffusionJob in one file, only what a job reads at its start.
COMPANION_KINDS = frozenset({"ConfigMap"})


@dataclass
class Submission:
    """The DiffusionJob to create (as its manifest, checked) and the objects to create before it."""

    job: DiffusionJob
    body: dict[str, Any]
    companions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.job.metadata.name

    def in_namespace(self, default: str) -> str:
        """The namespace the manifest names, else `default`."""
        return self.job.metadata.namespace or default


def submission(job: JobInput) -> Submission:
    """The objects to create for `job`; raises ValidationProblem (every problem, each naming its
    field, as `muralist validate` prints them) or ManifestError (a file or text that is no manifest)."""
    if isinstance(job, DiffusionJob):
        # Dumped and parsed again: a model changed after it was built was never validated.
        body = job.model_dump(by_alias=True, exclude_none=True, mode="json")
        return Submission(parse_job(body), body)
    if isinstance(job, dict):
        return Submission(parse_job(job), job)
    if isinstance(job, os.PathLike) or (isinstance(job, str) and _looks_like_a_path(job)):
        return _from_documents(str(job), None)
    if isinstance(job, str):
        return _from_documents("<yaml>", job)
    raise TypeError(f"a DiffusionJob is a manifest path, YAML text, a dict or a DiffusionJob, not {type(job).__name__}")


def _looks_like_a_path(text: str) -> bool:
    # YAML text of a manifest always has a line break or a "key: value"; a path has neither.
    return "\n" not in text and ": " not in text and Path(text).suffix.lower() in {".yaml", ".yml", ".json"}


def _from_documents(source: str, text: str | None) -> Submission:
    manifest = read_file("-" if text is not None else source, io.StringIO(text or ""))
    jobs = manifest.jobs
    if len(jobs) != 1:
        raise ManifestError(f"{source}: holds {len(jobs)} DiffusionJobs; create one at a time")
    others = [d for d in manifest.documents if d.kind != KIND]
    if refused := [d.label for d in others if d.kind not in COMPANION_KINDS]:
        raise ManifestError(f"{source}: only ConfigMaps may stand beside the DiffusionJob; create "
                            f"{', '.join(refused)} with kubectl")
    try:
        parsed = parse_job(jobs[0].body)
    except ValidationProblem as e:
        raise ValidationProblem([f"{jobs[0].label}: {p}" for p in e.problems]) from None
    return Submission(parsed, jobs[0].body, [d.body for d in others])
