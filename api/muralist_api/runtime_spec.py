"""The runtime spec: what the operator writes into the `<job>-spec` ConfigMap, and what
`muralist run` hands to each local process. Everything resolved, nothing left to look up.

On the wire (`runtime_spec_json`) it holds only what differs from its default: a field left out
means its default. That is what lets a runtime image of the release before read the spec of a newer
operator (contract/versions.py): a field the image does not know reaches it only when a job sets it,
and `read_runtime_spec` then refuses it by name (exit 78) instead of running without it.
"""

from __future__ import annotations

import json

from pydantic import Field, ValidationError

from muralist_api.base import ApiModel
from muralist_api.contract.termination import PermanentFailure
from muralist_api.contract.versions import runtime_lacks, unknown_fields
from muralist_api.job import DiffusionJobSpec
from muralist_api.planner.record import ParallelPlan


class RuntimeSpec(ApiModel):
    name: str = Field(description="The DiffusionJob's name.")
    namespace: str = Field("default", description="The DiffusionJob's namespace.")
    spec: DiffusionJobSpec
    output_dir: str = Field(
        description="Absolute directory the images go to; with output_uri, the local directory where files are "
        "staged (temps of shards, the index, the manifest) before each is uploaded whole.")
    output_uri: str | None = Field(None, description="Object storage the outputs go to (spec.output.uri/path).")
    prompts_file: str | None = Field(None, description="A mounted file with one prompt per line (from promptsFrom).")
    model_path: str | None = Field(
        None, description="Overrides spec.model.name with a local directory (muralist run --model)."
    )
    dataset_dir: str | None = Field(None, description="Where spec.dataset.volume is mounted (read-only).")
    dataset_uri: str | None = Field(None, description="The data set in object storage (spec.dataset.uri/path).")
    inputs_dir: str | None = Field(None, description="Where spec.inputs.volume is mounted (read-only).")
    inputs_uri: str | None = Field(None, description="The input images' prefix in object storage (spec.inputs.uri).")
    parallel_plan: ParallelPlan | None = Field(
        None, description="What spec.parallelism's strategy Auto resolved to (spec.parallelism is the plan's): each "
        "rank confirms it against what it measures before loading.")


def runtime_spec_json(runtime: RuntimeSpec) -> str:
    """The spec as the pods read it: unset fields and fields at their default left out."""
    return runtime.model_dump_json(by_alias=True, exclude_none=True, exclude_defaults=True)


def read_runtime_spec(text: str, refuse_unknown: bool = True) -> RuntimeSpec:
    """The spec from its JSON. A field this version does not know is ignored when it is null (unset);
    any other value means the job uses what this version lacks: PermanentFailure naming the field and
    this build, or, with `refuse_unknown` false (the launch entry point, which starts the ranks that
    refuse it), ignored too. Anything else wrong raises pydantic's ValidationError."""
    try:
        return RuntimeSpec.model_validate_json(text)
    except ValidationError as error:
        try:
            data = json.loads(text)
        except ValueError:
            raise error from None
        known, unknown = unknown_fields(RuntimeSpec, data)
        used = [f for f in unknown if f.value is not None]
        if not unknown:
            raise
        if used and refuse_unknown:
            raise PermanentFailure(used[0].path, runtime_lacks()) from None
        return RuntimeSpec.model_validate(known)
