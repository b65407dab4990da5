"""Generate the DiffusionJob CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema. The
conversion inlines `$ref`s, turns `Optional[X]` into plain X (absent means unset), keeps
defaults so the API server fills them in, and marks pass-through Kubernetes objects with
`x-kubernetes-preserve-unknown-fields`. The CEL rules are declared in the API beside the
field or model they guard, each naming the Python rule it mirrors (muralist_api/cel.py);
`CEL_RULES` collects them by schema path and they are added there.

Defaults only where the operator of the release before knows the field (`crd_baseline.KNOWN_PATHS`,
the schema paths of the skew baseline's CRD): the API server fills a CRD default into every object it
returns, stored ones included, and an older operator refuses a field it does not know. A field added
since is defaulted by pydantic alone (its description says to what), and a CEL rule that reads it
from another node checks `has()` first. Moving the baseline (contract/versions.py) gives the fields
that the new baseline knows their defaults back.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from muralist_api.cel import CelRule
from muralist_api.job import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, DiffusionJob, DiffusionJobSpec
from muralist_api.rules.catalog import DNS_LABEL_MAX
from muralist_api.status import DiffusionJobStatus
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault

from muralist_operator.crd_baseline import KNOWN_PATHS


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models a field holds itself (X, X | None): not the items of a list or a map."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    elif get_origin(annotation) in (Union, UnionType, Annotated):
        for arg in get_args(annotation):
            yield from _models(arg)


def _cel_rules() -> dict[str, list[CelRule]]:
    """The CEL rules declared on the models and their fields, by the JSON path of the schema node
    they sit on (dot-separated property names below the root; "" for the root)."""
    found: dict[str, list[CelRule]] = {}

    def add(path: str, rules: Iterable[CelRule]) -> None:
        if rules := list(rules):
            found.setdefault(path, []).extend(rules)

    def walk(model: type[BaseModel], path: str) -> None:
        add(path, getattr(model, "cel_rules", ()))
        for name, info in model.model_fields.items():
            field_path = f"{path}.{info.alias or name}"
            add(field_path, (m for m in info.metadata if isinstance(m, CelRule)))
            for child in _models(info.annotation):
                walk(child, field_path)

    add("", DiffusionJob.cel_rules)
    walk(DiffusionJobSpec, "spec")
    return found


CEL_RULES = _cel_rules()

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Progress",
        "type": "string",
        "jsonPath": ".status.progress.summary",
        "description": "Images completed / total",
    },
    {
        "name": "ETA",
        "type": "string",
        "jsonPath": ".status.progress.eta",
        "description": "Estimated time left, from the rate of the last minute",
    },
    {
        "name": "Waiting",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="PodsNotStarting")].reason',
        "description": "Why a pod has not started (the PodsNotStarting condition): ImagePullBackOff, Unschedulable, "
        "CreateContainerConfigError, FailedMount, FailedCreate, ...",
    },
    {"name": "Strategy", "type": "string", "jsonPath": ".spec.parallelism.strategy"},
    {"name": "World", "type": "integer", "jsonPath": ".status.worldSize", "description": "nodes x processesPerNode"},
    {"name": "Pods", "type": "integer", "jsonPath": ".status.nodes", "description": "Pods the job runs now"},
    {
        "name": "Desired",
        "type": "integer",
        "jsonPath": ".spec.parallelism.nodes",
        "description": "Pods asked for (kubectl scale changes it; Pods follows)",
    },
    {
        "name": "Restarts",
        "type": "integer",
        "jsonPath": ".status.restarts",
        "priority": 1,
        "description": "Pod retries, all indexes together",
    },
    {
        "name": "DP",
        "type": "integer",
        "jsonPath": ".status.dataParallelDegree",
        "priority": 1,
        "description": "Data-parallel degree",
    },
    {
        "name": "Plan",
        "type": "string",
        "jsonPath": ".status.parallelPlan.summary",
        "priority": 1,
        "description": "What strategy Auto chose (status.parallelPlan has its reasons)",
    },
    {
        "name": "GPU-s/item",
        "type": "number",
        "jsonPath": ".status.cost.gpuSecondsPerItem",
        "priority": 1,
        "description": "GPU-seconds per item rendered so far (processes for a job without GPUs)",
    },
    {
        "name": "Cost",
        "type": "number",
        "jsonPath": ".status.cost.costSoFar",
        "priority": 1,
        "description": "Cost so far at the price per GPU-hour (status.cost.estimatedCostToFinish: the rest)",
    },
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# `kubectl scale dj/NAME --replicas=N` (and autoscalers) change the number of pods: a resize.
SCALE = {
    "specReplicasPath": ".spec.parallelism.nodes",
    "statusReplicasPath": ".status.nodes",
    "labelSelectorPath": ".status.selector",
}

_DROP_KEYS = {"title", "additionalProperties", "$defs"}
_EXCLUSIVE = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}  # pydantic's gt / lt
# Read order for people who open the YAML: what a node is, then its constraints, then children.
_KEY_ORDER: Any = {"type": 0, "description": 1, "default": 2}.get


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Rewrite one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", ...) is None:
            del rest["default"]
        if len(branches) == 1:
            return _structural({**branches[0], **rest}, defs)
        if rest.get("x-kubernetes-int-or-string"):  # a count or a percentage (runPolicy.maxFailedItems)
            default = {"default": rest["default"]} if "default" in rest else {}
            return {"description": rest.get("description", ""), **default, "x-kubernetes-int-or-string": True}
        # A string or an object (prompts): the API server keeps it as is, the operator checks it.
        return {"description": rest.get("description", ""), "x-kubernetes-preserve-unknown-fields": True}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key in _EXCLUSIVE:
            # JSON Schema's exclusive bound is the bound itself; OpenAPI v3 (the API server's) is
            # the plain bound and a boolean beside it.
            out[_EXCLUSIVE[key]] = value
            out[key] = True
        else:
            out[key] = copy.deepcopy(value)
    out = {k: out[k] for k in sorted(out, key=lambda k: _KEY_ORDER(k, 3))}
    if node.get("type") == "object":
        extra = node.get("additionalProperties")
        if node.get("x-kubernetes-preserve-unknown-fields"):
            out.pop("properties", None)
        elif isinstance(extra, dict):
            out["additionalProperties"] = _structural(extra, defs)
    return out


class _FactoryDefaults(GenerateJsonSchema):
    """Fields with a default_factory get that default written out in full, so `kubectl get dj
    -o yaml` shows the resolved spec, and CEL rules (which the API server also checks against
    defaults) always find the fields they read."""

    def get_default_value(self, schema: Any) -> Any:
        factory = schema.get("default_factory")
        if factory is None:
            return super().get_default_value(schema)
        value = factory()
        if isinstance(value, BaseModel):
            return value.model_dump(by_alias=True, exclude_none=True, mode="json")
        if isinstance(value, dict | list):
            return value
        return NoDefault


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_FactoryDefaults)
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    return schema


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in filter(None, path.split(".")):
        node = node["properties"][part]
    return node


def schema_paths(node: dict[str, Any], path: str = "") -> Iterator[str]:
    """The path of every field below `node`: property names joined by dots, `[]` for a list's items,
    `{}` for a map's values (spec.prompts[], spec.podTemplate.labels{})."""
    for name, child in (node.get("properties") or {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path
        yield from schema_paths(child, child_path)
    for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            yield f"{path}{mark}"
            yield from schema_paths(node[key], f"{path}{mark}")


def defaults_only_where_known(node: dict[str, Any], known: frozenset[str], path: str = "") -> None:
    """Drop the CRD default of every field not in `known` (saying it in the description instead),
    and such fields from the default of an object that holds them."""
    if "default" in node:
        if path and path not in known:
            default = node.pop("default")
            node["description"] = (f"{node.get('description', '')} Default: {json.dumps(default)} (filled in by "
                                   "Muralist, not stored: operators of the release before do not know this field).")
        else:
            node["default"] = _known_part(node["default"], node, known, path)
    for name, child in (node.get("properties") or {}).items():
        defaults_only_where_known(child, known, f"{path}.{name}" if path else name)
    for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            defaults_only_where_known(node[key], known, f"{path}{mark}")


def _known_part(value: Any, node: dict[str, Any], known: frozenset[str], path: str) -> Any:
    """An object's default without the fields `known` lacks (a map's or a list's is kept whole)."""
    properties = node.get("properties")
    if not isinstance(value, dict) or not properties:
        return value
    return {k: _known_part(v, properties.get(k, {}), known, f"{path}.{k}") for k, v in value.items()
            if f"{path}.{k}" in known}


def openapi_schema() -> dict[str, Any]:
    spec = _model_schema(DiffusionJobSpec)
    status = _model_schema(DiffusionJobStatus)
    spec["description"] = "What to render, with which model, and how to split the work."
    status["description"] = "Observed state, written by the operator."
    root: dict[str, Any] = {
        "type": "object",
        "description": "A batch of diffusion image generation run in parallel with torchrun.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "muralist.dev/v1alpha1"},
            "kind": {"type": "string", "description": "DiffusionJob"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "description": "A DNS label; <name>-<index> must fit in 63 characters.",
                        "maxLength": DNS_LABEL_MAX,
                    }
                },
            },
            "spec": spec,
            "status": status,
        },
    }
    defaults_only_where_known(root, KNOWN_PATHS)
    for path, rules in CEL_RULES.items():
        _at(root, path).setdefault("x-kubernetes-validations", []).extend(r.wire() for r in rules)
    return root


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict, ready for YAML."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "annotations": {"muralist.dev/generated-by": "muralist crd (do not edit by hand)"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "muralist"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}, "scale": SCALE},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }
