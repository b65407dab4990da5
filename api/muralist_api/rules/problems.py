"""Parsing a manifest into a DiffusionJob, and every problem with it named by its field.

`parse_job` is the one entry point used by `muralist validate`, `muralist render`,
`muralist run` and the operator. Pydantic's errors are rewritten as one line per problem,
each starting with the field path; the cross-field rules (`spec_problems`) take their facts
and messages from the rules catalog, which the runtime uses too.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from muralist_api.base import SHOWN_CHARS, shown
from muralist_api.cel import python_rule
from muralist_api.rules import catalog, workloads
from muralist_api.rules.catalog import DNS_LABEL_MAX, Problem
from muralist_api.step_cache import cache_problems
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

if TYPE_CHECKING:
    from muralist_api.job import DiffusionJob, DiffusionJobSpec

DNS_1035_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


# The validation context's key that turns spec_problems off (parse_job's cross_field_rules).
CROSS_FIELD_RULES = "crossFieldRules"


class ValidationProblem(Exception):
    """A manifest that is not a valid DiffusionJob; `problems` each name a field, one line each."""

    def __init__(self, problems: list[str]):
        problems = [one_line(p) for p in problems]
        super().__init__("\n".join(problems))
        self.problems = problems


def one_line(text: str) -> str:
    """`text` with its line breaks escaped: a key or value with a newline (or U+2028) in it must
    not split a problem in two, nor forge a line that names another field."""
    lines = text.splitlines()
    return text if len(lines) <= 1 else "\\n".join(lines)


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("str", "PromptSpec") or item.startswith(("function-", "union[")):
            continue  # pydantic's union-branch markers are noise for a user
        elif _PLAIN_KEY.fullmatch(item) or item == "[key]":  # [key]: pydantic's mark of a bad map key
            parts.append(("." if parts else "") + item)
        else:  # a key the user made up: quoted, so that dots, spaces or newlines in it stay readable
            parts.append(f"[{json.dumps(item if len(item) <= SHOWN_CHARS else item[:SHOWN_CHARS] + '...')}]")
    return "".join(parts)


def _describe_error(err: dict[str, Any]) -> list[str]:
    path = _loc_to_path(err["loc"])
    msg: str = err["msg"]
    if err["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
        if msg.startswith(("spec.", "metadata.")):
            return msg.split("\n")
        return [f"{path}: {msg}"]
    if err["type"] == "extra_forbidden":
        parent = _loc_to_path(err["loc"][:-1])
        return [f"{path}: unknown field; check its spelling against `kubectl explain dj.{parent}`"]
    if err["type"] == "missing":
        return [f"{path}: required field is missing"]
    if err["type"] in ("literal_error", "enum"):
        return [f"{path}: got {shown(err.get('input'))}; {msg.lower()}"]
    got = err.get("input")
    if got is not None and not isinstance(got, dict | list):
        return [f"{path}: {msg} (got {shown(got)})"]
    return [f"{path}: {msg}"]


def problems_from(error: ValidationError) -> list[str]:
    """Pydantic errors as one line per problem, each starting with its field path."""
    out: list[str] = []
    for err in error.errors(include_url=False):
        for line in _describe_error(dict(err)):
            if line not in out:
                out.append(line)
    return out


@python_rule()
def name_problem(name: str, nodes: int) -> str | None:
    if not re.match(DNS_1035_LABEL_PATTERN, name):
        return (
            f"metadata.name: {shown(name)} must be a DNS label (lowercase letters, digits, '-', "
            "starting with a letter) because it names the headless Service and pod hostnames"
        )
    longest = f"{name}-{nodes - 1}"
    if len(longest) > DNS_LABEL_MAX:
        keep = DNS_LABEL_MAX - len(f"-{nodes - 1}")
        return (
            f"metadata.name: {shown(name)} is {len(name)} characters; pod hostname {shown(longest)} would "
            f"exceed {DNS_LABEL_MAX}: use at most {keep} characters"
        )
    return None


def parse_job(manifest: Any, cross_field_rules: bool = True) -> DiffusionJob:
    """Validate a manifest (a dict from YAML) or raise ValidationProblem naming every field.
    `cross_field_rules=False` checks each field alone (the operator reading a job admitted under older
    rules: operator/muralist_operator/skew.py)."""
    from muralist_api.job import API_VERSION, KIND, DiffusionJob

    if not isinstance(manifest, dict):
        raise ValidationProblem([f"manifest: expected a mapping, got {type(manifest).__name__}"])
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        raise ValidationProblem(
            [
                f"apiVersion/kind: got {shown(manifest.get('apiVersion'))}/{shown(manifest.get('kind'))}; "
                f"expected {API_VERSION}/{KIND}"
            ]
        )
    problems: list[str] = []
    name = _mapping(manifest.get("metadata")).get("name")
    nodes = _mapping(_mapping(manifest.get("spec")).get("parallelism")).get("nodes", 1)
    if isinstance(name, str):
        problem = name_problem(name, nodes if isinstance(nodes, int) and nodes >= 1 else 1)
        if problem:
            problems.append(problem)
    try:
        job = DiffusionJob.model_validate(manifest, context={CROSS_FIELD_RULES: cross_field_rules})
    except ValidationError as e:
        problems.extend(problems_from(e))
        raise ValidationProblem(problems) from None
    if problems:
        raise ValidationProblem(problems)
    return job


def _mapping(value: Any) -> dict[str, Any]:
    """A section read before validation: not a mapping reads as empty (validation names it)."""
    return value if isinstance(value, dict) else {}


# -- cross-field rules -------------------------------------------------------------------------


def spec_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """Every cross-field rule of a spec: (field path, message with the fix); empty when valid."""
    return [*_source_problems(spec), *_storage_problems(spec), *_shared_output_problems(spec),
            *_strategy_section_problems(spec),
            *_process_problems(spec), *_layout_problems(spec), *_workload_problems(spec), *_queue_problems(spec),
            *_size_problems(spec)]


@python_rule(no_cel=(
    "not in the CRD yet (CEL could say it; adding it changes the CRD): the operator refuses such a job "
    "when it parses it"
))
def _source_problems(spec: DiffusionJobSpec) -> list[Problem]:
    if spec.dataset is not None:
        if spec.prompts or spec.prompts_from is not None:
            return [("spec.dataset", "rows come from the data set alone; remove prompts and promptsFrom, or the "
                     "dataset")]
        if spec.dataset.end is not None and spec.dataset.end <= spec.dataset.start:
            return [("spec.dataset.end", f"is {spec.dataset.end}, not after start {spec.dataset.start}")]
        return []
    if not spec.prompts and spec.prompts_from is None:
        return [("spec.prompts", "no prompts; add at least one to prompts, set promptsFrom, or use spec.dataset")]
    return []


@python_rule()
def _storage_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """Each of dataset, inputs and output: a volume or a uri (output: at most one, an emptyDir when
    neither); credentials and endpoint only with a uri; one credentials Secret for the whole job."""
    out: list[Problem] = []
    secrets: dict[str, str] = {}
    for section in (spec.dataset, spec.inputs, spec.output):
        if section is None:
            continue
        name = section.section
        volume_required = name != "spec.output"
        if section.volume is not None and section.uri is not None:
            out.append((name, "set volume or uri, not both" + ("" if volume_required else
                                                                 " (neither: an emptyDir)")))
        elif volume_required and section.volume is None and section.uri is None:
            out.append((name, "set exactly one of volume (a mounted VolumeSource) and uri (object storage, e.g. "
                              "s3://bucket/prefix)"))
        if section.uri is None:
            for field, value in (("credentialsSecret", section.credentials_secret), ("endpoint", section.endpoint)):
                if value is not None:
                    out.append((f"{name}.{field}", f"goes with {name}.uri; set uri or remove {field}"))
        elif section.credentials_secret is not None:
            secrets[name] = section.credentials_secret
    for name, secret in list(secrets.items())[1:]:
        first, first_secret = next(iter(secrets.items()))
        if secret != first_secret:
            out.append((f"{name}.credentialsSecret",
                        f"is {shown(secret)}, but {first}.credentialsSecret is {shown(first_secret)}: the job's pods "
                        "have one set of storage credentials (a Secret's keys become their environment); use one "
                        "Secret"))
    return out


@python_rule()
def _shared_output_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """Pods of one job must see each other's outputs: the first pod merges every chunk, whichever pod
    rendered it. An emptyDir (spec.output.volume unset, or set to one) is each pod's own."""
    out = spec.output
    nodes = spec.parallelism.nodes
    if nodes <= 1 or out.uri is not None or (out.volume is not None and "emptyDir" not in out.volume):
        return []
    what = "spec.output.volume is an emptyDir" if out.volume is not None else \
        "spec.output sets no volume (the default is an emptyDir)"
    return [("spec.output", f"{what}, which each of the {nodes} pods gets its own: the first pod could not merge "
             "the images the others render, and they would go with their pods; set spec.output.volume to a volume "
             "every pod mounts (a ReadWriteMany PersistentVolumeClaim: {persistentVolumeClaim: {claimName: "
             "results}}), or spec.output.uri to object storage, or nodes: 1")]


def _input_uses(spec: DiffusionJobSpec) -> tuple[set[str], str]:
    """Which inputs the job's items carry ("image", "mask"), and the field that says so."""
    if spec.dataset is not None:
        cols = spec.dataset.columns
        return {u for u, c in (("image", cols.image), ("mask", cols.mask)) if c}, "spec.dataset.columns"
    uses = set()
    for p in spec.prompt_objects:
        uses |= {u for u, v in (("image", p.image), ("mask", p.mask)) if v}
    return uses, "spec.prompts"


@python_rule(no_cel=(
    "needs the rules catalog's tables (model pipelines, inputs, schedulers, caches), which the CRD does "
    "not carry (its fuseAdapters rule alone could be CEL, not in the CRD yet); the operator refuses such "
    "a job when it parses it"
))
def _workload_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """Inputs, videos, the scheduler, the cache, adapters and the call's extraArgs against what the catalog
    knows."""
    gen, par = spec.generation, spec.parallelism
    pipeline = spec.model.pipeline or catalog.KNOWN_MODEL_PIPELINES.get(spec.model.name)
    uses, field_name = _input_uses(spec)
    out: list[Problem] = []
    if uses and spec.inputs is None:
        out.append(("spec.inputs", f"{field_name} name input images; set spec.inputs.volume or spec.inputs.uri to "
                    "where they are"))
    out += workloads.input_problems(pipeline, uses, field_name)
    out += workloads.video_problems(pipeline, gen.num_frames, gen.height, gen.width, spec.output.format)
    if gen.scheduler is not None:
        out += workloads.scheduler_problems(gen.scheduler.name)
    if gen.cache is not None:
        out += cache_problems(gen.cache.type, gen.cache.options, par.strategy)
    out += workloads.extra_args_problems(gen.extra_args)
    if spec.model.adapters and par.strategy == "TensorParallel" and not spec.model.fuse_adapters:
        out.append(("spec.model.fuseAdapters", "TensorParallel shards the base layers, and a LoRA must be merged "
                    "into them first; set fuseAdapters: true"))
    return out


@python_rule()
def _strategy_section_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """A strategy's own section (contextParallel, ...) only goes with that strategy."""
    par = spec.parallelism
    out: list[Problem] = []
    if par.context_parallel is not None and par.tensor_parallel is not None:
        out.append(("spec.parallelism", "contextParallel and tensorParallel cannot both be set (diffusers' "
                    "ParallelConfig refuses it); keep the one that matches strategy"))
    for field, strategy in (("context_parallel", "ContextParallel"), ("tensor_parallel", "TensorParallel"),
                            ("device_map", "DeviceMap")):
        if getattr(par, field) is not None and par.strategy != strategy:
            out.append((f"spec.parallelism.{to_camel(field)}",
                        f"is only used by strategy {strategy}, but strategy is {par.strategy}; remove it or set "
                        f"strategy: {strategy}"))
    return out


@python_rule()
def _process_problems(spec: DiffusionJobSpec) -> list[Problem]:
    par = spec.parallelism
    if par.strategy == "DeviceMap":
        if par.processes_per_node in (None, 1):
            return []
        return [("spec.parallelism.processesPerNode",
                 f"is {par.processes_per_node}, but DeviceMap runs one process per pod over all its GPUs: set "
                 "processesPerNode: 1 (or leave it out) and use nodes for replicas")]
    if par.gpus_per_node > 0 and par.processes_per_node not in (None, par.gpus_per_node):
        return [("spec.parallelism.processesPerNode",
                 f"is {par.processes_per_node} but gpusPerNode is {par.gpus_per_node}; with GPUs it is one "
                 f"process per GPU: set processesPerNode: {par.gpus_per_node} or leave it out")]
    return []


@python_rule()
def _layout_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """The CP / TP layout against the catalog (the runtime checks the same on the machine)."""
    from muralist_api.job import ContextParallelSpec, TensorParallelSpec

    par = spec.parallelism
    if par.strategy not in ("ContextParallel", "TensorParallel"):
        return []
    ppn, gpu = par.resolved_processes_per_node, par.gpus_per_node > 0
    if par.strategy == "ContextParallel":
        cp = par.context_parallel or ContextParallelSpec()
        out = catalog.context_parallel_problems(cp.ring_degree, cp.ulysses_degree, cp.attention_backend, ppn, gpu,
                                                par.nodes)
    else:
        tp = par.tensor_parallel or TensorParallelSpec()
        out = catalog.tensor_parallel_problems(tp.degree, ppn, gpu)
    if spec.generation.batch_size != 1:
        out.append(("spec.generation.batchSize",
                    f"is {spec.generation.batch_size}, but a {par.strategy} group renders one image at a time "
                    "(batched context parallelism is broken in several models); set batchSize: 1"))
    return out + catalog.plan_problems(par.strategy, catalog.known_layout(spec.model.name, spec.model.pipeline))


@python_rule()
def _queue_problems(spec: DiffusionJobSpec) -> list[Problem]:
    """runPolicy.workloadSlices: Kueue's elastic workload slices need a queue and no topology request."""
    from muralist_api.pods import KUEUE_TOPOLOGY_ANNOTATIONS

    policy = spec.run_policy
    if not policy.workload_slices:
        return []
    out: list[Problem] = []
    if policy.queue_name is None:
        out.append(("spec.runPolicy.workloadSlices", "resizes through Kueue, which admits only a queued job; set "
                    "runPolicy.queueName or remove workloadSlices"))
    for key in KUEUE_TOPOLOGY_ANNOTATIONS:
        if key in spec.pod_template.annotations:
            out.append(("spec.runPolicy.workloadSlices", f"Kueue does not resize a job whose pods request a topology "
                        f"(podTemplate.annotations[{key}]); remove that annotation or workloadSlices"))
    return out


@python_rule(no_cel="measures the serialized spec, which CEL cannot; the operator refuses such a job when it parses it")
def _size_problems(spec: DiffusionJobSpec) -> list[Problem]:
    size = len(spec.model_dump_json(by_alias=True, exclude_none=True).encode())
    return catalog.spec_size_problems(size, len(spec.prompts))
