"""Generate the DiffusionJob CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema. The
conversion inlines `$ref`s, turns `Optional[X]` into plain X (absent means unset), keeps
defaults so the API server fills them in, and marks pass-through Kubernetes objects with
`x-kubernetes-preserve-unknown-fields`. Cross-field rules are added as CEL at the paths
in `CEL_RULES`; they mirror `muralist_api.rules.problems.spec_problems` and take their
facts (backends, reserved names, limits) from the same catalog and contract.
"""

from __future__ import annotations

import copy
from typing import Any

from muralist_api.contract import reserved_env_cel
from muralist_api.job import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, DiffusionJobSpec
from muralist_api.rules.catalog import ATTENTION_BACKENDS, DNS_LABEL_MAX
from muralist_api.status import DiffusionJobStatus
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault

# Processes per pod as the models resolve it (Parallelism.resolved_processes_per_node).
_PPN = (
    "(has(self.processesPerNode) ? self.processesPerNode : "
    "((self.strategy == 'DeviceMap' || self.gpusPerNode == 0) ? 1 : self.gpusPerNode))"
)
_CP_DEGREE = "(self.contextParallel.ringDegree * self.contextParallel.ulyssesDegree)"


def _cel_list(names: list[str]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


_CP_BACKENDS = [b.name for b in ATTENTION_BACKENDS.values() if b.context_parallel]
_RING_BACKENDS = [b.name for b in ATTENTION_BACKENDS.values() if b.context_parallel and b.lse]
_CPU_CP_BACKENDS = [b.name for b in ATTENTION_BACKENDS.values() if b.context_parallel and b.cpu]


def _rule(rule: str, message: str) -> dict[str, Any]:
    return {"rule": rule, "message": message}


def _immutable(field: str) -> dict[str, Any]:
    return _rule(
        "self == oldSelf",
        f"spec.{field} cannot change after creation; create a new DiffusionJob (runPolicy fields can change)",
    )


# JSON path of an object in the schema (dot-separated property names below the root;
# '*' for a list's items) -> CEL rules evaluated with `self` bound to that object.
CEL_RULES: dict[str, list[dict[str, Any]]] = {
    "": [
        _rule(
            f"size(self.metadata.name) + 1 + size(string(self.spec.parallelism.nodes - 1)) <= {DNS_LABEL_MAX}",
            f"metadata.name is too long: pod hostname <name>-<index> must fit in {DNS_LABEL_MAX} "
            "characters; shorten the name",
        ),
    ],
    "spec": [
        _rule(
            "!(self.parallelism.strategy in ['ContextParallel', 'TensorParallel']) || self.generation.batchSize == 1",
            "spec.generation.batchSize: a ContextParallel or TensorParallel group renders one "
            "image at a time; set batchSize: 1",
        ),
        _rule(
            "has(self.promptsFrom) == has(oldSelf.promptsFrom)",
            "spec.promptsFrom cannot be added or removed after creation; create a new DiffusionJob",
        ),
    ],
    **{
        f"spec.{f}": [_immutable(f)]
        for f in (
            "model",
            "promptsFrom",
            "generation",
            "parallelism",
            "output",
            "image",
            "resources",
            "podTemplate",
            "networkPolicy",  # the operator creates it with the job, once
        )
    },
    "spec.parallelism": [
        _rule(
            "!(has(self.contextParallel) && has(self.tensorParallel))",
            "spec.parallelism: contextParallel and tensorParallel cannot both be set (diffusers' "
            "ParallelConfig refuses it); keep the one that matches strategy",
        ),
        _rule(
            "!has(self.contextParallel) || self.strategy == 'ContextParallel'",
            "spec.parallelism.contextParallel is only used by strategy ContextParallel; remove "
            "it or set strategy: ContextParallel",
        ),
        _rule(
            "!has(self.tensorParallel) || self.strategy == 'TensorParallel'",
            "spec.parallelism.tensorParallel is only used by strategy TensorParallel; remove it "
            "or set strategy: TensorParallel",
        ),
        _rule(
            "!has(self.deviceMap) || self.strategy == 'DeviceMap'",
            "spec.parallelism.deviceMap is only used by strategy DeviceMap; remove it or set strategy: DeviceMap",
        ),
        _rule(
            "self.strategy != 'DeviceMap' || !has(self.processesPerNode) || self.processesPerNode == 1",
            "spec.parallelism.processesPerNode: DeviceMap runs one process per pod over all its "
            "GPUs; set processesPerNode: 1 (or leave it out) and use nodes for replicas",
        ),
        _rule(
            "self.strategy == 'DeviceMap' || self.gpusPerNode == 0 || !has(self.processesPerNode) "
            "|| self.processesPerNode == self.gpusPerNode",
            "spec.parallelism.processesPerNode: with GPUs it is one process per GPU; set it to "
            "gpusPerNode or leave it out",
        ),
        _rule(
            f"self.strategy != 'ContextParallel' || (has(self.contextParallel) && {_CP_DEGREE} >= 2)",
            "spec.parallelism.contextParallel: ringDegree x ulyssesDegree must be 2 or more "
            "(1 is plain data parallelism); set ulyssesDegree or ringDegree",
        ),
        _rule(
            f"self.strategy != 'ContextParallel' || !has(self.contextParallel) || {_PPN} % {_CP_DEGREE} == 0 "
            f"|| ({_CP_DEGREE} % {_PPN} == 0 && self.nodes % ({_CP_DEGREE} / {_PPN}) == 0)",
            "spec.parallelism.contextParallel: ringDegree x ulyssesDegree must divide processesPerNode (a group "
            "inside one pod) or be a multiple of it that divides the pods (a group over whole pods)",
        ),
        _rule(
            "self.strategy != 'TensorParallel' || "
            f"{_PPN} % (has(self.tensorParallel) ? self.tensorParallel.degree : 2) == 0",
            "spec.parallelism.tensorParallel.degree must divide processesPerNode (a group stays inside one pod)",
        ),
        _rule(
            "self.strategy != 'TensorParallel' || self.gpusPerNode > 0",
            "spec.parallelism.gpusPerNode: TensorParallel needs GPUs (diffusers refuses it on "
            "CPU); set gpusPerNode or use DataParallel / ContextParallel",
        ),
        _rule(
            "self.strategy != 'ContextParallel' || self.gpusPerNode > 0 || !has(self.contextParallel) || "
            f"self.contextParallel.attentionBackend in {_cel_list(_CPU_CP_BACKENDS)}",
            "spec.parallelism.contextParallel.attentionBackend: needs GPUs and this job has none; on CPU "
            f"use one of {', '.join(_CPU_CP_BACKENDS)}",
        ),
    ],
    "spec.parallelism.contextParallel": [
        _rule(
            f"self.attentionBackend in {_cel_list(_CP_BACKENDS)}",
            "spec.parallelism.contextParallel.attentionBackend: not a diffusers backend that supports "
            f"context parallelism; use one of {', '.join(_CP_BACKENDS)}",
        ),
        _rule(
            f"self.ringDegree == 1 || self.attentionBackend in {_cel_list(_RING_BACKENDS)}",
            "spec.parallelism.contextParallel.attentionBackend: ring attention (ringDegree > 1) "
            f"needs a backend that returns LSE; use one of {', '.join(_RING_BACKENDS)} on GPUs, "
            "or set ringDegree: 1",
        ),
    ],
    "spec.output.path": [
        _rule("!self.startsWith('/')", "spec.output.path must be relative to the volume"),
        _rule(
            "!self.matches('(^|/)[.][.](/|$)')",
            "spec.output.path must not contain '..': it must stay inside the volume",
        ),
        _rule("self.matches('[^/]')", "spec.output.path must not be empty"),
    ],
    "spec.podTemplate.env": [
        _rule(
            reserved_env_cel(),
            "spec.podTemplate.env: PET_*, MURALIST_*, torchrun's variables and HF_TOKEN are set "
            "by Muralist; rename or remove them (use model.tokenSecret for HF_TOKEN)",
        ),
    ],
}

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
    {"name": "Strategy", "type": "string", "jsonPath": ".spec.parallelism.strategy"},
    {"name": "World", "type": "integer", "jsonPath": ".status.worldSize", "description": "nodes x processesPerNode"},
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
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP_KEYS = {"title", "additionalProperties", "$defs"}
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
    return _structural(raw, raw.get("$defs", {}))


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in filter(None, path.split(".")):
        node = node["properties"][part]
    return node


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
    for path, rules in CEL_RULES.items():
        _at(root, path).setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(rules))
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
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }
