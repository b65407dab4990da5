"""diffusers' cache hooks on the pipeline's transformer: enabled from the job's spec (model/features.py
calls `enable_cache` after the adapters and the scheduler), and paused while the cache gate renders
without them.

`transformer.enable_cache(config)` registers a hook per block that diffusers' module patterns for
the cache match (like diffusers' own hooks/, one config per cache: config.py builds it); a cache
whose patterns match no block of this transformer would change nothing, and is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.step_cache import CACHES, CacheSpec

from .config import CACHE_FIELD, cache_config


def _hook_count(module: Any) -> int:
    """diffusers hooks registered anywhere in a module (HookRegistry per submodule)."""
    return sum(len(getattr(getattr(m, "_diffusers_hook", None), "hooks", None) or {}) for m in module.modules())


def enable_cache(pipe: Any, cache: CacheSpec, steps: int) -> str:
    """The cache on the transformer, with the config built from the spec; what was enabled, in words."""
    transformer = getattr(pipe, "transformer", None)
    if transformer is None or not hasattr(transformer, "enable_cache"):
        what = type(transformer).__name__ if transformer is not None else f"{type(pipe).__name__} (no transformer)"
        raise PermanentFailure(CACHE_FIELD, f"{what} takes no step cache (diffusers' cache hooks need a transformer "
                               "with enable_cache); remove generation.cache")
    config = cache_config(pipe, cache, steps)
    before = _hook_count(transformer)
    try:
        transformer.enable_cache(config)
    except (ValueError, TypeError) as e:
        raise PermanentFailure(CACHE_FIELD, f"{type(transformer).__name__} refuses {cache.type}: {e}"
                               .splitlines()[0]) from None
    if _hook_count(transformer) == before:
        # diffusers matches module names against its own patterns and says nothing when none
        # matches: TaylorSeer's '^blocks.*attn' misses Wan's blocks.N.attn1 / attn2.
        transformer.disable_cache()
        others = ", ".join(k for k in CACHES if k != cache.type)
        raise PermanentFailure(f"{CACHE_FIELD}.type", f"{cache.type} finds no module to cache in "
                               f"{type(transformer).__name__} (diffusers' module patterns for it match none of its "
                               f"blocks), so it would change nothing; use another cache ({others})")
    return f"step cache {cache.type} on {type(transformer).__name__}" + (
        f" {dict(cache.options)}" if cache.options else "")


@contextmanager
def cache_paused(pipe: Any) -> Iterator[None]:
    """The pipeline without its step cache for a while (the cache gate's reference renders), then
    with the very config it had (calibrated ratios included), its hooks' state fresh."""
    transformer = pipe.transformer
    config = transformer._cache_config  # diffusers' CacheMixin keeps the enabled config here
    transformer.disable_cache()
    try:
        yield
    finally:
        transformer.enable_cache(config)
