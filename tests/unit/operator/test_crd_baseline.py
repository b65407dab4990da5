"""The CRD defaults only fields that the skew baseline's operator knows (crd.py, crd_baseline.py): the API
server fills a CRD default into every object it returns, and an older operator refuses a field it does
not know, so a default on a field added since would fail every stored job under that operator."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from muralist_operator.crd import build_crd, defaults_only_where_known, schema_paths
from muralist_operator.crd_baseline import BASELINE, KNOWN_PATHS

from tests.paths import REPO


def _defaults(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if "default" in node:
        yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _defaults(sub, f"{path}.{name}" if path else name)
    for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            yield from _defaults(node[key], f"{path}{mark}")


def test_the_known_fields_are_those_of_the_recorded_baselines_crd() -> None:
    # Reads the baseline's CRD from git: a clone without that commit fails here, loudly.
    versions = dict(line.split("=", 1) for line in (REPO / "hack" / "versions.env").read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    assert versions["SKEW_BASELINE"] == BASELINE
    check = subprocess.run([sys.executable, "hack/skew_baseline.py", "--check"], cwd=REPO, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr
    assert {"spec.runPolicy.workloadSlices", "spec.prompts[]", "status.phase"} <= KNOWN_PATHS


def test_the_crd_defaults_no_field_the_baseline_lacks() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert set(schema_paths(schema)) >= KNOWN_PATHS, "a field of the baseline is gone: older objects lose it"
    for path, node in _defaults(schema):
        assert path in KNOWN_PATHS, f"{path} has a CRD default but the baseline's operator does not know it"
        if isinstance(node["default"], dict) and node.get("properties"):
            unknown = {k for k in node["default"] if f"{path}.{k}" not in KNOWN_PATHS}
            assert not unknown, f"{path}'s default holds {unknown}, which the baseline's operator does not know"


def test_a_field_added_later_keeps_its_default_out_of_the_crd_and_says_it() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"runPolicy": {
        "type": "object", "default": {"maxRestarts": 3, "startTimeoutSeconds": 600, "labels": {"a": "b"}},
        "properties": {
            "maxRestarts": {"type": "integer", "default": 3},
            "startTimeoutSeconds": {"type": "integer", "description": "Fail a pod that never starts.", "default": 600},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}, "default": {"a": "b"}},
            "retry": {"type": "object", "default": {"backoff": 2, "jitter": True},
                      "properties": {"backoff": {"type": "integer"}, "jitter": {"type": "boolean", "default": True}}},
        }}}}
    known = frozenset({"runPolicy", "runPolicy.maxRestarts", "runPolicy.labels", "runPolicy.retry",
                       "runPolicy.retry.backoff"})
    defaults_only_where_known(schema, known)
    policy = schema["properties"]["runPolicy"]
    assert policy["default"] == {"maxRestarts": 3, "labels": {"a": "b"}}  # a map's default is kept whole
    assert policy["properties"]["maxRestarts"]["default"] == 3
    added = policy["properties"]["startTimeoutSeconds"]
    assert "default" not in added
    assert added["description"].startswith("Fail a pod that never starts. Default: 600 (filled in by Muralist")
    retry = policy["properties"]["retry"]
    assert retry["default"] == {"backoff": 2} and "default" not in retry["properties"]["jitter"]
