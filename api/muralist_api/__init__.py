"""Muralist's API: what the operator image and the runtime image share (`muralist-api`).

Torch-free and standalone (import-linter checks it imports neither image's code), so both
images install it and the operator needs nothing else of the runtime:

- the DiffusionJob types (the CRD is generated from them): `job` (the DiffusionJob, its spec and
  the rules across the spec's sections), a module per section, each with its own rules:
  `model`, `generation`, `parallelism`, `output`, `data` (prompts, promptsFrom, dataset,
  inputs), `pods` (pod template, run policy, network policy); `options` (LoRA adapters,
  scheduler), `status`, `base` (camelCase, unknown fields refused, how a message quotes a
  value); `cel`: the CEL rules declared on those types, each naming the Python rule it mirrors;
- `step_cache`: the step cache's API in one module (its request and quality gate, its catalog and
  rule, what ranks measured, its status);
- `rules/`: the rules catalog shared by admission and the runtime (`catalog`, `workloads`,
  `sequence`), and parsing a manifest, every problem named by its field (`problems`);
- `contract/`: what crosses between the images: the pod contract (launcher command,
  environment, paths: `pod`; the runtime's one typed view of that environment: `env`; exit
  codes, termination message: `termination`), the progress wire (`progress`), the image counts
  both carry (`counts`), the output folder's names and its job file (`output_folder`), the resume
  digest (`resume`), the output folder's versions (`output_format`) and which versions of Muralist
  work together (`versions`);
- `storage`: where a job's data lives (a volume or a URI) and `open_location`, the one opener of
  object storage (the runtime's data sets, inputs and outputs, the client's results);
- `planner/`: `strategy: Auto` and `muralist plan`: a model's sizes from its safetensors headers, the
  devices, the memory estimate, the decision table and the plan as status carries it;
- `runtime_spec`: the runtime spec the operator hands to the pods;
- `items`: work items and their seeds;
- `manifests`: reading manifest files.

The names most callers need are re-exported here. Its layers, bottom up (import-linter checks
them: no circle): `cel`; `base`, the catalog and the contract's plain names; what sections are
made of (`storage`, `step_cache`, `options`); the sections; `job`; `rules/problems` and `items`;
what reads whole jobs (`runtime_spec`, `manifests`, `contract/resume`, `contract/env`).
"""

from muralist_api.contract import PERMANENT_FAILURE_EXIT_CODE, PermanentFailure
from muralist_api.items import Item, item_key
from muralist_api.job import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    DiffusionJob,
    DiffusionJobSpec,
    Strategy,
)
from muralist_api.rules.problems import ValidationProblem, parse_job, problems_from
from muralist_api.runtime_spec import RuntimeSpec
from muralist_api.status import TERMINAL_PHASES, DiffusionJobStatus, Phase

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PERMANENT_FAILURE_EXIT_CODE",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "TERMINAL_PHASES",
    "VERSION",
    "DiffusionJob",
    "DiffusionJobSpec",
    "DiffusionJobStatus",
    "Item",
    "PermanentFailure",
    "Phase",
    "RuntimeSpec",
    "Strategy",
    "ValidationProblem",
    "item_key",
    "parse_job",
    "problems_from",
]
