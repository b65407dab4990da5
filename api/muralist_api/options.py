"""diffusers features a job asks for: LoRA adapters, the scheduler, a step cache (and its quality gate).

The facts behind their rules (which scheduler classes and cache hooks exist, which options
each cache takes, which caches a context-parallel group may use) are in the catalog and are
checked against the installed diffusers by the tests; these models only carry the request.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from muralist_api.base import ApiModel, KubeObject
from muralist_api.cel import CelRule, python_rule
from muralist_api.rules.problems import shown

CacheType = Literal["FirstBlockCache", "TaylorSeer", "MagCache", "FasterCache", "PyramidAttentionBroadcast"]


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


_PERCENT = re.compile(r"\d+(\.\d+)?%")
VERIFY_FIELD = "spec.generation.cache.verify"


@python_rule()
def verify_threshold_problem(on_fail: str, min_psnr: float | None, min_ssim: float | None) -> str | None:
    """onFail: DisableCache acts on a threshold: without one nothing can trigger it."""
    if on_fail == "DisableCache" and min_psnr is None and min_ssim is None:
        return (f"{VERIFY_FIELD}.onFail: DisableCache turns the cache off when a threshold is missed; set minPsnr "
                "or minSsim, or leave onFail out")
    return None


class CacheVerify(ApiModel):
    """The quality gate of a step cache: a sample of the job's items is also rendered without the
    cache (same seed), and the cached image is compared with it (PSNR, SSIM)."""

    cel_rules = (
        CelRule("self.onFail != 'DisableCache' || has(self.minPsnr) || has(self.minSsim)",
                f"{VERIFY_FIELD}.onFail: DisableCache turns the cache off when a threshold is missed; set minPsnr "
                "or minSsim, or leave onFail out", mirrors=verify_threshold_problem),
    )

    sample: int | str = Field(
        1,
        json_schema_extra={"x-kubernetes-int-or-string": True},
        description="How many items are also rendered without the cache: a count (1 or more), or a percentage "
        "of the job's items such as '5%' (at least one item). The first items of the job are the sample, so "
        "every rank knows which without talking and the verdict comes before most of the job is rendered. "
        "Each costs one more render without the cache.",
    )
    min_psnr: float | None = Field(
        None, gt=0, le=200,
        description="The lowest PSNR (dB, 8-bit pixels) a sampled cached image may have against its uncached "
        "render; identical images count as infinite. 30-40 dB: differences hard to see.",
    )
    min_ssim: float | None = Field(
        None, gt=0, le=1,
        description="The lowest SSIM (0-1; Gaussian-windowed, on luminance) a sampled cached image may have "
        "against its uncached render.",
    )
    on_fail: Literal["Fail", "DisableCache"] = Field(
        "Fail",
        description="Fail: a sampled item below a threshold fails the job (permanently: the setting, not the "
        "pod, is wrong). DisableCache: the cache is turned off for the rest of the job (job.json says from "
        "which item), and the sampled item is written as rendered without it.",
    )

    @field_validator("sample")
    @classmethod
    def _count_or_percent(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"is {value}; sample at least one item, or give a percentage such as '5%'")
        if isinstance(value, str):
            if not _PERCENT.fullmatch(value):
                raise ValueError(f"{shown(value)} is neither a count nor a percentage; write e.g. 4 or '5%'")
            if not 0 < float(value.rstrip("%")) <= 100:
                raise ValueError(f"{shown(value)} is not a percentage above 0 and at most 100")
        return value

    @model_validator(mode="after")
    def _threshold_for_disable(self) -> CacheVerify:
        problem = verify_threshold_problem(self.on_fail, self.min_psnr, self.min_ssim)
        if problem:
            raise ValueError(problem.partition(": ")[2])
        return self

    def thresholds(self) -> dict[str, float]:
        """The thresholds set, by their field names (minPsnr, minSsim)."""
        return {name: value for name, value in (("minPsnr", self.min_psnr), ("minSsim", self.min_ssim))
                if value is not None}

    def sample_count(self, total: int) -> int:
        """How many of the job's `total` items are verified (at least one, at most all)."""
        if isinstance(self.sample, int):
            return min(self.sample, total)
        return min(total, max(1, math.ceil(total * float(self.sample.rstrip("%")) / 100)))


class CacheSpec(ApiModel):
    """A step cache: blocks whose output barely changes from one step to the next are reused."""

    type: CacheType = Field(
        description="FirstBlockCache | TaylorSeer | MagCache | FasterCache | PyramidAttentionBroadcast "
        "(diffusers' cache hooks, transformer.enable_cache)."
    )
    options: KubeObject = Field(
        default_factory=dict,
        description="The cache's knobs in camelCase, e.g. {threshold: 0.1} (FirstBlockCache, MagCache), "
        "{calibrate: true} or {ratios: [...]} (MagCache on a model other than FLUX.1: ratios measured on the "
        "job's first item and recorded in job.json, or given from such a job), "
        "{cacheInterval: 4, disableCacheBeforeStep: 2} (TaylorSeer), {spatialAttentionBlockSkipRange: 2} "
        "(FasterCache, PyramidAttentionBroadcast); `kubectl explain` lists the types, the docs (tasks/caches.md) "
        "the knobs.",
    )
    verify: CacheVerify | None = Field(
        None, description="Check what the cache costs: render a sample of the items also without it and compare "
        "(PSNR, SSIM per sampled item in the manifest, their summary in job.json); with a threshold, fail the "
        "job or turn the cache off when it costs more than that.",
    )
