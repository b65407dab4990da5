"""The torch-free half of Muralist: the API, its rules and the pod contract.

The operator imports these modules and nothing else of the runtime (import-linter checks it),
so nothing here may import torch or diffusers, even indirectly. One concept per module:

- `api`, `status`, `base`: the DiffusionJob types (the CRD is generated from them);
- `problems`: parsing a manifest, and every problem named by its field;
- `catalog`, `sequence`: the rules catalog shared by admission and the runtime;
- `contract`: the pod contract (launcher command, environment, paths, exit codes,
  termination message);
- `resolved`: the runtime spec the operator hands to the pods;
- `items`: work items and their seeds;
- `resume`: when outputs already on the volume may be kept;
- `output_format`: the output folder's versions, how older ones are read, the rule for changing it;
- `manifests`: reading manifest files.

The names most callers need are re-exported here.
"""

from .api import (
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
from .contract import PERMANENT_FAILURE_EXIT_CODE, PermanentFailure
from .items import Item, item_key
from .problems import ValidationProblem, parse_job, problems_from
from .resolved import RuntimeSpec
from .status import TERMINAL_PHASES, DiffusionJobStatus, Phase

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
