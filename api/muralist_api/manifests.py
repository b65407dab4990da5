"""Reading manifest files: the one reader behind `muralist validate`, `render` and `run`.

A file holds YAML documents (`-` reads stdin). The DiffusionJobs among them are validated;
other kinds beside them (the ConfigMap of a job's prompts, say) are kept, so that `muralist
run` can serve a `promptsFrom` ConfigMap from the same file. A file with no DiffusionJob at
all is an error. Problems are reported as `FILE#doc (name): field: problem and fix`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from muralist_api.base import SHOWN_CHARS, shown
from muralist_api.job import API_VERSION, KIND, DiffusionJob
from muralist_api.rules.problems import ValidationProblem, one_line, parse_job

# libyaml when PyYAML has it (its wheels do): a manifest of 10,000 inline prompts reads ~8x faster.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ManifestError(Exception):
    """A file that cannot be read as manifests; the message names the file."""


@dataclass
class Document:
    source: str
    index: int
    body: Any

    @property
    def label(self) -> str:
        metadata = self.body.get("metadata") if isinstance(self.body, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        where = f"{self.source}#{self.index}"
        return one_line(f"{where} ({str(name)[:SHOWN_CHARS]})") if name else where

    @property
    def kind(self) -> str | None:
        return self.body.get("kind") if isinstance(self.body, dict) else None


@dataclass
class ManifestFile:
    """The documents of one file: its DiffusionJobs and the other objects beside them."""

    source: str
    documents: list[Document] = field(default_factory=list)

    @property
    def jobs(self) -> list[Document]:
        return [d for d in self.documents if d.kind == KIND]

    def config_map_value(self, name: str, key: str) -> str | None:
        """data[key] of the ConfigMap `name` in this file, if it is there."""
        for doc in self.documents:
            metadata, data = doc.body.get("metadata"), doc.body.get("data")
            if doc.kind == "ConfigMap" and isinstance(metadata, dict) and metadata.get("name") == name:
                value = data.get(key) if isinstance(data, dict) else None
                return value if isinstance(value, str) else None
        return None


def _read(source: str, stdin: TextIO) -> str:
    if source == "-":
        return stdin.read()
    try:
        with open(source, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ManifestError(f"{source}: cannot read: {e.strerror}") from None


def read_file(source: str, stdin: TextIO) -> ManifestFile:
    """All documents of a file; a file without a DiffusionJob is a ManifestError."""
    text = _read(source, stdin)
    try:
        bodies = [b for b in yaml.load_all(text, Loader=_LOADER) if b is not None]
    except RecursionError:
        raise ManifestError(f"{source}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ManifestError(f"{source}: not valid YAML{where}: {problem}") from None
    manifest = ManifestFile(source, [Document(source, i, body) for i, body in enumerate(bodies)])
    if not manifest.jobs:
        kinds = ", ".join(
            f"{shown(d.body.get('apiVersion'))}/{shown(d.body.get('kind'))}" if isinstance(d.body, dict)
            else type(d.body).__name__
            for d in manifest.documents[:5]
        ) or "nothing"
        raise ManifestError(one_line(
            f"{source}: apiVersion/kind: no DiffusionJob found (got {kinds}); expected apiVersion: {API_VERSION}, "
            f"kind: {KIND}"
        ))
    return manifest


@dataclass
class Reader:
    """Walks files, yields each valid job with its file, and reports every problem."""

    err: TextIO
    stdin: TextIO
    failed: bool = False

    def jobs(self, files: list[str]) -> Iterator[tuple[DiffusionJob, ManifestFile]]:
        for source in files:
            try:
                manifest = read_file(source, self.stdin)
            except ManifestError as e:
                self.report([str(e)])
                continue
            for doc in manifest.jobs:
                try:
                    job = parse_job(doc.body)
                except ValidationProblem as e:
                    self.report([f"{doc.label}: {p}" for p in e.problems])
                    continue
                yield job, manifest

    def report(self, problems: list[str]) -> None:
        self.failed = True
        for problem in problems:
            self.err.write(problem + "\n")
