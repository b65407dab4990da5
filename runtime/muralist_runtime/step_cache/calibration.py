"""MagCache calibrated for the model the job loads (generation.cache options.calibrate).

MagCache skips a step when the accumulated change of the transformer's residual, predicted
from per-step "magnitude ratios" (mean norm of this step's residual over the last one's), stays
under its threshold; the ratios are a property of the model. diffusers publishes them for
FLUX.1-dev only, and has a calibration mode (MagCacheConfig(calibrate=True)) that skips nothing,
measures the ratios of one render and prints them at its last step.

With calibrate: true the job does that on its first item (the item the canary uses, its own
seed) before rendering anything: model/features.py enables MagCache in calibration mode,
`calibrate` renders the item, takes the ratios from diffusers' tail hook at its last step, and
enables MagCache again with them (the job's threshold and skips). Every rank calibrates on
the same item with the same seed, so every rank gets the same ratios without talking (on one
kind of device). The job file records them (`cacheCalibration`), so that later jobs of the model
can pass them as options.ratios and skip the calibration.

The render is the model's (model/call.py's `render`), passed in by model/loading.py: the step cache
sits below the stages that use it.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Sequence
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec

from .config import CACHE_FIELD, cache_config

log = logging.getLogger("muralist")

# model/call.py's render: (pipe, runtime, items) -> each item's output, or None where it failed.
Render = Callable[[Any, RuntimeSpec, Sequence[Item]], list[Any]]


def wanted(runtime: RuntimeSpec) -> bool:
    cache = runtime.spec.generation.cache
    return cache is not None and cache.type == "MagCache" and cache.options.get("calibrate") is True


def _tail_hook(transformer: Any) -> Any:
    """diffusers' MagCache hook on the transformer's last block: the one that measures the ratios."""
    from diffusers.hooks.mag_cache import MagCacheBlockHook

    for module in transformer.modules():
        registry = getattr(module, "_diffusers_hook", None)
        for hook in (getattr(registry, "hooks", None) or {}).values():
            if isinstance(hook, MagCacheBlockHook) and hook.is_tail:
                return hook
    return None


def calibrate(pipe: Any, runtime: RuntimeSpec, item: Item, render: Render) -> dict[str, Any]:
    """Measure the ratios on `item`, re-enable MagCache with them; the job file's `cacheCalibration`."""
    cache = runtime.spec.generation.cache
    assert cache is not None and wanted(runtime)
    steps = runtime.spec.generation.steps
    tail = _tail_hook(pipe.transformer)
    if tail is None:
        raise PermanentFailure(f"{CACHE_FIELD}.type", f"MagCache hooked no block of {type(pipe.transformer).__name__}"
                               ": nothing to calibrate")
    runs: list[list[float]] = []  # one per cache context whose last step passed (cond, uncond)
    advance = tail._advance_step

    def keep_ratios(state: Any) -> None:
        # diffusers clears the ratios at the last step, after printing them: take them first.
        if state.step_index + 1 >= tail.config.num_inference_steps:
            runs.append(list(state.calibration_ratios))
        advance(state)

    tail._advance_step = keep_ratios
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # diffusers prints them; the log says them once
            output = render(pipe, runtime, [item])[0]
    finally:
        del tail._advance_step
    if output is None or not runs or len(runs[0]) != steps:
        raise PermanentFailure(f"{CACHE_FIELD}.options.calibrate",
                               f"MagCache calibration on item {item.key} measured {len(runs[0]) if runs else 0} of "
                               f"{steps} steps" + ("" if output is not None else " (its render failed)"))
    ratios = runs[0]
    pipe.transformer.disable_cache()
    pipe.transformer.enable_cache(cache_config(pipe, cache, steps, ratios=ratios))
    log.info("MagCache calibrated on item %s (%d steps): ratios %s", item.key, steps,
             ", ".join(f"{r:.4f}" for r in ratios))
    return {"type": "MagCache", "transformer": type(pipe.transformer).__name__, "steps": steps, "item": item.key,
            "seed": item.seed, "ratios": ratios}
