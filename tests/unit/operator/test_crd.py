from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from muralist_operator.crd import CEL_RULES, build_crd

from tests.paths import REPO
from tests.unit.api.rules.invalid_cases import INVALID_CASES

CRD_FILE = REPO / "crds" / "muralist.dev_diffusionjobs.yaml"


def _schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}" if path else name)
    if "items" in node:
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_what_the_models_generate() -> None:
    committed = yaml.safe_load(CRD_FILE.read_text())
    assert committed == build_crd(), "crds/ is stale: run `muralist crd > crds/muralist.dev_diffusionjobs.yaml`"


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    missing = [
        path
        for path, node in _nodes(_schema())
        if path.count(".") >= 1 and not path.endswith(("[]", "{}")) and not node.get("description")
    ]
    assert missing == []


def test_schema_is_structural() -> None:
    for path, node in _nodes(_schema()):
        typed = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or typed, path
        assert "$ref" not in node and "anyOf" not in node, path


def test_exclusive_bounds_are_openapi_v3_booleans() -> None:
    # The API server refuses a CRD whose exclusiveMinimum is a number (JSON Schema's form).
    bounded = [(path, node) for path, node in _nodes(_schema()) if "exclusiveMinimum" in node]
    assert bounded, "generation.cache.verify.minPsnr is > 0"
    for path, node in bounded:
        assert node["exclusiveMinimum"] is True and isinstance(node["minimum"], int | float), path


def test_cel_rules_sit_on_existing_schema_nodes() -> None:
    paths = {path for path, _ in _nodes(_schema())}
    for path in CEL_RULES:
        assert path == "" or path in paths, path


def test_printer_columns_and_names() -> None:
    crd = build_crd()
    version = crd["spec"]["versions"][0]
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names[:6] == ["Phase", "Progress", "ETA", "Waiting", "Strategy", "World"] and names[-1] == "Age"
    assert crd["spec"]["names"]["shortNames"] == ["dj"]
    assert names[6:8] == ["Pods", "Desired"], "a resize's current and asked-for size"
    waiting = version["additionalPrinterColumns"][3]
    assert waiting["jsonPath"] == '.status.conditions[?(@.type=="PodsNotStarting")].reason'
    assert "priority" not in waiting, "shown by a plain kubectl get dj"
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.parallelism.nodes", "statusReplicasPath": ".status.nodes",
        "labelSelectorPath": ".status.selector"}}


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_match_the_generated_schema(example: Path) -> None:
    validator = jsonschema.Draft7Validator(_schema())
    jobs = [d for d in yaml.safe_load_all(example.read_text()) if d and d["kind"] == "DiffusionJob"]
    assert jobs
    for job in jobs:
        errors = [e.message for e in validator.iter_errors(job)]
        assert errors == []


@pytest.mark.parametrize(
    "manifest",
    [
        m
        for cid, m, _, _ in INVALID_CASES
        if cid in {"bad-dtype", "zero-steps", "height-not-multiple-of-8", "bad-strategy"}
    ],
)
def test_schema_refuses_single_field_errors(manifest: dict[str, Any]) -> None:
    assert list(jsonschema.Draft7Validator(_schema()).iter_errors(manifest))
