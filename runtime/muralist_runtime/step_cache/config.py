"""A step cache's diffusers config object, built from the job's camelCase options
(muralist_api/step_cache.py's CACHES maps each option to its config field).

MagCache needs magnitude ratios calibrated for the model: diffusers publishes them for FLUX.1-dev
only (MAG_RATIOS_FOR); any other model calibrates its own (options.calibrate: calibration.py) or is
given them (options.ratios).
"""

from __future__ import annotations

from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.contract.output_folder import JOB_FILE
from muralist_api.step_cache import CACHES, CacheSpec

CACHE_FIELD = "spec.generation.cache"
# diffusers' published MagCache ratios, by the transformer class they were calibrated on.
MAG_RATIOS_FOR = {"FluxTransformer2DModel": "FLUX_MAG_RATIOS"}


def cache_config(pipe: Any, cache: CacheSpec, steps: int, ratios: list[float] | None = None) -> Any:
    """The diffusers config object of a cache, from its camelCase options.

    MagCache takes its magnitude ratios from `ratios` (just calibrated), else from options.ratios,
    else calibrates (options.calibrate: a config that never skips, for calibration.py), else
    diffusers' published ones for the transformer; diffusers interpolates them to `steps`.
    """
    import diffusers.hooks as hooks

    kind = CACHES[cache.type]
    kwargs: dict[str, Any] = {kind.options[k][0]: v for k, v in cache.options.items() if k in kind.options}
    transformer = type(pipe.transformer).__name__
    if cache.type == "MagCache":
        kwargs["num_inference_steps"] = steps
        if ratios is not None:
            kwargs.update(mag_ratios=ratios, calibrate=False)
        elif not kwargs.get("calibrate") and "mag_ratios" not in kwargs:
            published = MAG_RATIOS_FOR.get(transformer)
            if published is None:
                raise PermanentFailure(f"{CACHE_FIELD}.options",
                                       f"MagCache needs magnitude ratios calibrated for this model ({transformer}); "
                                       f"diffusers publishes them for {', '.join(MAG_RATIOS_FOR)} only: set "
                                       "calibrate: true (the job calibrates on its first item and records the ratios "
                                       f"in {JOB_FILE}), or ratios: [...] from such a job")
            from diffusers.hooks import mag_cache

            kwargs["mag_ratios"] = getattr(mag_cache, published)
    if cache.type in ("FasterCache", "PyramidAttentionBroadcast"):
        kwargs["current_timestep_callback"] = lambda: pipe.current_timestep
    if cache.type == "FasterCache":
        # Its unconditional-branch skipping needs a pipeline that batches the unconditional
        # and conditional inputs together; Flux and Wan in diffusers run them as separate calls
        # (IndexError at the first step without this).
        kwargs.setdefault("is_guidance_distilled", True)
    try:
        return getattr(hooks, kind.config)(**kwargs)
    except (ValueError, TypeError) as e:
        raise PermanentFailure(f"{CACHE_FIELD}.options", f"{cache.type}: {e}".splitlines()[0]) from None
