"""diffusers features a job asks for: LoRA adapters and the scheduler (the step cache, the third, has a
module of its own: step_cache.py).

The facts behind their rules (which scheduler classes exist) are in the catalog and are checked
against the installed diffusers by the tests; these models only carry the request.
"""

from __future__ import annotations

from pydantic import Field

from muralist_api.base import ApiModel, KubeObject


class Adapter(ApiModel):
    """A LoRA loaded on top of the base model (diffusers' PEFT integration)."""

    name: str = Field(
        min_length=1, max_length=1024,
        description="Hugging Face hub repo id of the LoRA, or an absolute path inside the pod (a file or a folder).",
    )
    weight_name: str | None = Field(
        None, max_length=256,
        description="The weight file inside the repo or folder (e.g. pytorch_lora_weights.safetensors).",
    )
    scale: float = Field(1.0, ge=-10, le=10, description="How strongly the adapter applies (0 turns it off).")
    revision: str | None = Field(None, max_length=256, description="Hub revision of the adapter.")


class SchedulerSpec(ApiModel):
    name: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9]+Scheduler$",
        description="A diffusers scheduler class (e.g. DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler), "
        "built from the pipeline's own scheduler config.",
    )
    config: KubeObject = Field(
        default_factory=dict, description="Overrides of the scheduler config (e.g. {use_karras_sigmas: true})."
    )
