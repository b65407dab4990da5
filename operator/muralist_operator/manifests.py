"""`muralist validate` and `muralist render`: read manifests, report problems, print objects.

Errors are reported as `FILE[#doc] name: field: problem and fix`, never as a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import yaml
from muralist_runtime.spec import API_VERSION, KIND, DiffusionJob, ValidationProblem, parse_job

from muralist_operator.render import OperatorSettings, RenderError, render_children


@dataclass
class Document:
    source: str
    index: int
    body: Any

    @property
    def label(self) -> str:
        name = self.body.get("metadata", {}).get("name") if isinstance(self.body, dict) else None
        where = f"{self.source}#{self.index}"
        return f"{where} ({name})" if name else where


class ManifestError(Exception):
    pass


def _read(source: str, stdin: TextIO) -> str:
    if source == "-":
        return stdin.read()
    try:
        with open(source, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ManifestError(f"{source}: cannot read: {e.strerror}") from None


def load_documents(source: str, stdin: TextIO) -> list[Document]:
    text = _read(source, stdin)
    try:
        bodies = [b for b in yaml.safe_load_all(text) if b is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ManifestError(f"{source}: not valid YAML{where}: {problem}") from None
    return [Document(source, i, body) for i, body in enumerate(bodies)]


def diffusion_job_documents(source: str, stdin: TextIO) -> list[Document]:
    """The DiffusionJob documents of a file. Other kinds beside one (the ConfigMap of its
    prompts, say) are left alone; a file with no DiffusionJob at all is an error."""
    docs = load_documents(source, stdin)
    jobs = [d for d in docs if isinstance(d.body, dict) and d.body.get("kind") == KIND]
    if not jobs:
        kinds = (
            ", ".join(
                f"{d.body.get('apiVersion')}/{d.body.get('kind')}"
                if isinstance(d.body, dict)
                else type(d.body).__name__
                for d in docs
            )
            or "nothing"
        )
        raise ManifestError(
            f"{source}: no DiffusionJob found (got {kinds}); expected apiVersion: {API_VERSION}, kind: {KIND}"
        )
    return jobs


def check(job: DiffusionJob, settings: OperatorSettings) -> None:
    """Rules that only show when rendering (a prompt list too large for a ConfigMap)."""
    try:
        render_children(job, job.metadata.namespace or "default", settings)
    except RenderError as e:
        raise ValidationProblem([str(e)]) from None


def summary_line(job: DiffusionJob) -> str:
    par = job.spec.parallelism
    total = job.total_images
    images = (
        f"{total} images"
        if total is not None
        else (
            f"{job.spec.generation.images_per_prompt} per prompt from "
            f"configmap/{job.spec.prompts_from.config_map_key_ref.name}"  # type: ignore[union-attr]
        )
    )
    return (
        f"{job.metadata.name}: valid ({par.strategy}, world size {par.world_size}, "
        f"data-parallel degree {par.data_parallel_degree}, {images})"
    )


class Reader:
    """Walks files, yields valid jobs and reports every problem; `failed` tells if any."""

    def __init__(self, settings: OperatorSettings, err: TextIO, stdin: TextIO):
        self.settings, self.err, self.stdin = settings, err, stdin
        self.failed = False

    def jobs(self, files: list[str]) -> Iterator[DiffusionJob]:
        for source in files:
            try:
                docs = diffusion_job_documents(source, self.stdin)
            except ManifestError as e:
                self._report([str(e)])
                continue
            for doc in docs:
                try:
                    job = parse_job(doc.body)
                    check(job, self.settings)
                except ValidationProblem as e:
                    self._report([f"{doc.label}: {p}" for p in e.problems])
                    continue
                yield job

    def _report(self, problems: list[str]) -> None:
        self.failed = True
        for problem in problems:
            self.err.write(problem + "\n")


def validate_files(files: list[str]) -> int:
    """Print one line per valid job to stdout and every problem to stderr; 1 if any."""
    reader = Reader(OperatorSettings(), sys.stderr, sys.stdin)
    for job in reader.jobs(files):
        sys.stdout.write(summary_line(job) + "\n")
    return 1 if reader.failed else 0


def render_files(files: list[str], namespace: str | None = None, image: str | None = None) -> int:
    settings = OperatorSettings(runtime_image=image) if image else OperatorSettings()
    reader = Reader(settings, sys.stderr, sys.stdin)
    objects: list[dict[str, Any]] = []
    for job in reader.jobs(files):
        ns = namespace or job.metadata.namespace or "default"
        objects.extend(render_children(job, ns, settings).all())
    if reader.failed:
        return 1
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=100))
    return 0
