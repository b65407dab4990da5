"""A plan as it travels: in status.parallelPlan, the runtime spec (the pods confirm it) and the job file.

`ParallelPlan` is what `strategy: Auto` resolved to and why: the spec.parallelism chosen, one
reason per decision quoting its figures, the device it was made for and the estimated peak memory
per device. The operator decides it once, when the job is created, and keeps it in status (a
resize or a new Job keeps the same layout); the pods read it from their runtime spec and stop at
once (exit 78) when what they measure contradicts it (planner/table.py's `confirm_problems`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from muralist_api.base import ApiModel, KubeObject

Objective = Literal["throughput", "latency"]


class MemoryFigures(ApiModel):
    weights_bytes: int = Field(0, description="Weights on one device, at the job's dtype.")
    activations_bytes: int = Field(0, description="The denoiser's activations at the job's sequence length.")
    vae_decode_bytes: int = Field(0, description="The VAE decode of one call's outputs (with vaeTiling: per tile).")
    peak_bytes: int = Field(0, description="weights + max(activations, VAE decode): the estimated peak per device.")


class ParallelPlan(ApiModel):
    objective: Objective = Field("throughput", description="What the plan optimised: throughput or latency.")
    parallelism: KubeObject = Field(
        default_factory=dict, description="The spec.parallelism chosen (strategy, processesPerNode, the strategy's "
        "section), as a manifest writes it.")
    summary: str = Field("", description="The layout in a few words, e.g. 'ContextParallel ulysses 2 x ring 1 over "
                         "2 devices'.")
    reasons: list[str] = Field(default_factory=list, max_length=32,
                               description="One line per decision, quoting the figures it was made from.")
    device: str = Field("", description="The devices planned for, and where their figures came from.")
    device_memory_bytes: int | None = Field(None, description="Memory of one device as planned for; unset when "
                                            "unknown (no label, no budget): the pods still check what they measure.")
    interconnect: str = Field("", description="nvlink, pcie or none, as planned for.")
    model_source: str = Field("", description="Where the model's sizes came from (safetensors headers, hub "
                              "metadata, the catalog).")
    memory: MemoryFigures | None = Field(None, description="The estimate per device, when the model's sizes are "
                                         "known.")
