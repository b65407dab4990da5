"""The runtime spec: what the operator writes into the `<job>-spec` ConfigMap, and what
`muralist run` hands to each local process. Everything resolved, nothing left to look up."""

from __future__ import annotations

from pydantic import Field

from muralist_api.base import ApiModel
from muralist_api.job import DiffusionJobSpec


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
