"""The step cache's API, in one place: what a job asks for, what admission knows of each cache, what the
ranks measured and what the status says of it (the runtime's side is muralist_runtime/step_cache/).

- The request, `spec.generation.cache`: `CacheSpec` (the type, its options in camelCase) and its
  quality gate `CacheVerify` (`verify`: a sample rendered also without the cache and compared);
- the catalog: `CACHES`, one `CacheKind` per type of `CacheType` (diffusers' config class, the options
  exposed, whether the ranks of a parallel group stay in step with it), checked against the installed
  diffusers by tests/unit/api/rules/test_catalog.py, and admission's rule on the options
  (`cache_problems`, called from job.py's `workload_problems`);
- what crosses between the images: `CacheSample`, the share of the sample a rank or a pod measured
  (its rank file, its termination message: contract/termination.py carries it);
- `CacheVerifyStatus`: status.cacheVerify, the finished pods' samples combined by the operator.

The rules carry the request only; the runtime checks what only the loaded model can tell.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from muralist_api.base import ApiModel, KubeObject, member_path, shown
from muralist_api.cel import CelRule, python_rule
from muralist_api.contract.output_folder import JOB_FILE
from muralist_api.rules.catalog import Problem

# -- the catalog ---------------------------------------------------------------------------------

CacheType = Literal["FirstBlockCache", "TaylorSeer", "MagCache", "FasterCache", "PyramidAttentionBroadcast"]


@dataclass(frozen=True)
class CacheKind:
    """One diffusers cache hook: its config class, the knobs we expose, and whether the ranks of
    a context/tensor-parallel group would take the same decisions with it."""

    config: str
    options: dict[str, tuple[str, type]] = field(default_factory=dict)  # camelCase -> (config field, type)
    parallel_safe: bool = True
    why_not_parallel: str = ""


CACHES: dict[str, CacheKind] = {
    "FirstBlockCache": CacheKind(
        "FirstBlockCacheConfig", {"threshold": ("threshold", float)}, parallel_safe=False,
        why_not_parallel="it skips blocks from each rank's own share of the sequence, without the group agreeing"),
    "TaylorSeer": CacheKind("TaylorSeerCacheConfig", {
        "cacheInterval": ("cache_interval", int), "disableCacheBeforeStep": ("disable_cache_before_step", int),
        "disableCacheAfterStep": ("disable_cache_after_step", int), "maxOrder": ("max_order", int)}),
    # ratios: calibrated magnitude ratios (one per step, interpolated to the job's steps), e.g.
    # the `cacheCalibration.ratios` a calibrating job wrote to its job file; calibrate: measure them
    # on the job's first item first (the runtime does, every rank alike).
    "MagCache": CacheKind(
        "MagCacheConfig", {"threshold": ("threshold", float), "maxSkipSteps": ("max_skip_steps", int),
                           "retentionRatio": ("retention_ratio", float), "ratios": ("mag_ratios", list),
                           "calibrate": ("calibrate", bool)}, parallel_safe=False,
        why_not_parallel="it skips steps from each rank's own residuals, without the group agreeing"),
    "FasterCache": CacheKind("FasterCacheConfig", {
        "spatialAttentionBlockSkipRange": ("spatial_attention_block_skip_range", int),
        "temporalAttentionBlockSkipRange": ("temporal_attention_block_skip_range", int),
        "unconditionalBatchSkipRange": ("unconditional_batch_skip_range", int),
        "isGuidanceDistilled": ("is_guidance_distilled", bool)}),
    "PyramidAttentionBroadcast": CacheKind("PyramidAttentionBroadcastConfig", {
        "spatialAttentionBlockSkipRange": ("spatial_attention_block_skip_range", int),
        "temporalAttentionBlockSkipRange": ("temporal_attention_block_skip_range", int),
        "crossAttentionBlockSkipRange": ("cross_attention_block_skip_range", int)}),
}


def _positive_numbers(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in value)


@python_rule(no_cel="needs the rules catalog's cache kinds and their options, which the CRD does not carry")
def cache_problems(kind: str, options: dict[str, object], strategy: str) -> list[Problem]:
    cache = CACHES[kind]
    out: list[Problem] = []
    for name, value in options.items():
        path = member_path("spec.generation.cache.options", name)
        known = cache.options.get(name)
        if known is None:
            out.append((path,
                        f"{kind} has no option {name!r}; it takes {', '.join(cache.options) or 'none'}"))
        elif not (isinstance(value, known[1]) or (known[1] is float and isinstance(value, int))) or (
                known[1] is not bool and isinstance(value, bool)):
            out.append((path, f"must be a {known[1].__name__}, not {value!r}"))
        elif known[1] is list and not _positive_numbers(value):
            out.append((path, "must be a list of positive numbers (one per step)"))
    if options.get("calibrate") is True and "ratios" in options:
        out.append(("spec.generation.cache.options.calibrate", f"{kind} either calibrates or uses the ratios given; "
                    "remove one"))
    if strategy in ("ContextParallel", "TensorParallel") and not cache.parallel_safe:
        safe = ", ".join(k for k, c in CACHES.items() if c.parallel_safe)
        out.append(("spec.generation.cache.type",
                    f"{kind} cannot run in a {strategy} group: {cache.why_not_parallel}; use {safe}"))
    return out


# -- the request ---------------------------------------------------------------------------------

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
        f"pod, is wrong). DisableCache: the cache is turned off for the rest of the job ({JOB_FILE} says from "
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
        f"job's first item and recorded in {JOB_FILE}, or given from such a job), "
        "{cacheInterval: 4, disableCacheBeforeStep: 2} (TaylorSeer), {spatialAttentionBlockSkipRange: 2} "
        "(FasterCache, PyramidAttentionBroadcast); `kubectl explain` lists the types, the docs (tasks/caches.md) "
        "the knobs.",
    )
    verify: CacheVerify | None = Field(
        None, description="Check what the cache costs: render a sample of the items also without it and compare "
        f"(PSNR, SSIM per sampled item in the manifest, their summary in {JOB_FILE}); with a threshold, fail the "
        "job or turn the cache off when it costs more than that.",
    )


# -- what the ranks measured ----------------------------------------------------------------------


@dataclass(frozen=True)
class CacheSample:
    """The share of generation.cache.verify's sample that ranks measured: how many items, their
    lowest PSNR (dB; None when every one was identical to its uncached render) and SSIM, and
    whether the cache was turned off (onFail: DisableCache)."""

    sampled: int
    min_psnr: float | None = None
    min_ssim: float | None = None
    cache_off: bool = False

    def combine(self, other: CacheSample | None) -> CacheSample:
        if other is None:
            return self
        return CacheSample(self.sampled + other.sampled, _lowest(self.min_psnr, other.min_psnr),
                           _lowest(self.min_ssim, other.min_ssim), self.cache_off or other.cache_off)

    def to_wire(self) -> dict[str, Any]:
        return {"sampled": self.sampled, "minPsnr": _rounded(self.min_psnr, 3), "minSsim": _rounded(self.min_ssim, 6),
                "cacheOff": self.cache_off}

    @classmethod
    def from_wire(cls, doc: object) -> CacheSample | None:
        """The sample in a termination message or a rank file; None when there is none (or it is not one)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("sampled"), int):
            return None

        def number(key: str) -> float | None:
            value = doc.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        return cls(doc["sampled"], number("minPsnr"), number("minSsim"), doc.get("cacheOff") is True)


def _lowest(a: float | None, b: float | None) -> float | None:
    return min(a, b) if a is not None and b is not None else a if b is None else b


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


class CacheVerifyStatus(ApiModel):
    sampled: int = Field(0, description="Items of generation.cache.verify's sample measured so far (by pods that "
                         "finished), each against its render without the cache.")
    min_psnr: float | None = Field(None, description="The lowest PSNR (dB) of a cached image against its uncached "
                                   "render; unset while every one was identical.")
    min_ssim: float | None = Field(None, description="The lowest SSIM (0-1) of a cached image against its uncached "
                                   "render.")
    cache_off: bool = Field(False, description="A sampled item missed a threshold and onFail: DisableCache turned the "
                            "cache off for the rest of the job (cache-off.json in the job folder says which).")
