"""`muralist plan JOB.yaml --gpus-per-node N --gpu-memory SIZE --interconnect nvlink|pcie`.

Prints the spec.parallelism that `strategy: Auto` would choose for the job on those devices, as YAML
that passes `muralist validate` when put back into the manifest, with one comment line per decision
quoting its figures and the estimated peak memory per GPU. The model's sizes come from its files
(a local folder's safetensors headers, a hub repo's by ranged reads), else from the planner's
catalog; nothing is loaded (muralist_runtime/plan/auto.py, muralist_api/planner/).

Exit codes: 0 planned, 1 the manifest is invalid or no layout fits (the reason on stderr).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml
from muralist_api.job import DiffusionJobSpec, Strategy
from muralist_api.planner.device import gib
from muralist_api.planner.record import ParallelPlan
from muralist_api.planner.table import CannotPlan, plan_job, planned
from muralist_api.rules.problems import ValidationProblem


def as_auto(spec: DiffusionJobSpec, gpus: int | None, objective: str | None) -> DiffusionJobSpec:
    """The spec with strategy Auto (whatever it had), on `gpus` GPUs per pod when given."""
    par = spec.parallelism.model_dump(by_alias=True, exclude_none=True)
    for section in ("contextParallel", "tensorParallel", "deviceMap"):
        par.pop(section, None)
    par["strategy"] = Strategy.AUTO.value
    if gpus is not None:
        par["gpusPerNode"] = gpus
    if par.get("gpusPerNode", 1) > 0:
        par.pop("processesPerNode", None)
    if objective is not None:
        par["objective"] = objective
    return spec.model_copy(update={"parallelism": type(spec.parallelism).model_validate(par)})


def section_yaml(spec: DiffusionJobSpec, plan: ParallelPlan) -> str:
    """spec.parallelism as the plan resolves it, as a manifest writes it (defaults left out)."""
    par = planned(spec, plan).parallelism
    doc: dict[str, Any] = {"strategy": par.strategy, "nodes": par.nodes, "gpusPerNode": par.gpus_per_node,
                           **par.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)}
    return yaml.safe_dump({"parallelism": doc}, sort_keys=False, width=100)


def report(spec: DiffusionJobSpec, plan: ParallelPlan) -> str:
    lines = [f"# muralist plan ({plan.objective}): {plan.summary}", f"# devices: {plan.device}",
             f"# model sizes: {plan.model_source or 'unknown'}", section_yaml(spec, plan).rstrip(), "# reasons:"]
    lines += [f"#   {reason}" for reason in plan.reasons]
    if plan.memory is not None:
        m = plan.memory
        lines.append(f"# estimated peak memory per GPU: {gib(m.peak_bytes)} (weights {gib(m.weights_bytes)} + "
                     f"max(activations {gib(m.activations_bytes)}, VAE decode {gib(m.vae_decode_bytes)}))")
    else:
        lines.append("# estimated peak memory per GPU: unknown (the model's sizes could not be read)")
    return "\n".join(lines) + "\n"


def plan(args: argparse.Namespace) -> int:
    from muralist_runtime.local import load_job
    from muralist_runtime.plan.auto import local_device, model_facts

    try:
        job, _ = load_job(args.manifest)
        spec = as_auto(job.spec, args.gpus_per_node, args.objective)
        device = local_device(spec, args.gpu_memory, args.interconnect)
        chosen = plan_job(spec, model_facts(spec, args.model), device)
    except ValidationProblem as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return 1
    except CannotPlan as e:
        print(f"muralist plan: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a size that is not one (parse_size), a model the planner cannot read
        print(f"muralist plan: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(report(spec, chosen))
    return 0
