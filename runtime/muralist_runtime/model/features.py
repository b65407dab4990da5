"""diffusers features a job asks for, applied to the loaded pipeline: LoRA adapters, another
scheduler, a step cache (muralist_api/options.py has the API of the first two; the step cache is
step_cache/'s, muralist_api/step_cache.py its API).

`apply_features` runs after the pipeline is placed and before the consistency canary's
reference and `enable_parallelism`: adapters (and their fusing) must change the base layers
before a tensor-parallel plan shards them, and diffusers' cache hooks must wrap the blocks
before the context-parallel hooks do (enabled after, FirstBlockCache and MagCache fail at the
first step on Wan; before, they match one process exactly). Every rank applies the same
features from the same spec, so the ranks of a group stay identical.

What retrying cannot fix (an adapter that does not fit the model, a scheduler config diffusers
refuses, a cache this transformer cannot take) is a PermanentFailure naming the field.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

from muralist_api.contract import PermanentFailure
from muralist_api.options import Adapter, SchedulerSpec
from muralist_api.runtime_spec import RuntimeSpec

from ..step_cache import hooks
from . import hub

log = logging.getLogger("muralist")


def apply_features(pipe: Any, runtime: RuntimeSpec) -> list[str]:
    """Adapters, scheduler, cache, in that order; what was applied, in words (for the log)."""
    spec = runtime.spec
    applied = []
    if spec.model.adapters:
        applied.append(load_adapters(pipe, spec.model.adapters, spec.model.fuse_adapters))
    if spec.generation.scheduler is not None:
        applied.append(set_scheduler(pipe, spec.generation.scheduler))
    if spec.generation.cache is not None:
        applied.append(hooks.enable_cache(pipe, spec.generation.cache, spec.generation.steps))
    for line in applied:
        log.info("%s", line)
    return applied


# -- LoRA adapters -------------------------------------------------------------------------------

ADAPTERS_FIELD = "spec.model.adapters"
# peft's NoMatchingPeftModuleError is a ValueError ("Target modules ... not found in the base
# model"), as is diffusers' "Invalid LoRA checkpoint"; a LoRA of another width fails with a
# RuntimeError ("size mismatch for ..."); a weight file that is no safetensors with an OSError.
_MISFITS = (ValueError, RuntimeError, KeyError)


def adapter_name(index: int) -> str:
    """The name each adapter is loaded under: unique even when two share a repo."""
    return f"adapter{index}"


def _location(adapter: Adapter) -> tuple[str, dict[str, Any]]:
    """What load_lora_weights takes for an adapter: a folder or repo, and weight_name / revision.

    A path to a file is split into its folder and weight_name.
    """
    kwargs: dict[str, Any] = {}
    source = adapter.name
    if source.startswith("/"):
        path = Path(source)
        if path.is_file():
            source, kwargs["weight_name"] = str(path.parent), path.name
        elif not path.is_dir():
            raise FileNotFoundError(f"{source} is not a file or a folder in the pod")
    elif adapter.revision:
        kwargs["revision"] = adapter.revision
    if adapter.weight_name and "weight_name" not in kwargs:
        kwargs["weight_name"] = adapter.weight_name
    return source, kwargs


def load_adapters(pipe: Any, adapters: list[Adapter], fuse: bool) -> str:
    """load_lora_weights per adapter, set_adapters with the scales, fused when asked.

    The hub's refusals name the adapter's field (hub.py); an adapter that loads but does not
    fit the model, or a local path that is wrong, names the adapter; network errors are retried.
    """
    if not hasattr(pipe, "load_lora_weights"):
        raise PermanentFailure(ADAPTERS_FIELD, f"{type(pipe).__name__} cannot load LoRA adapters (no "
                               "load_lora_weights in diffusers)")
    names = []
    for index, adapter in enumerate(adapters):
        name = adapter_name(index)
        try:
            source, kwargs = _location(adapter)
            pipe.load_lora_weights(source, adapter_name=name, token=hub.token(), **kwargs)
        except Exception as e:
            local = adapter.name.startswith("/")
            refused = None if local else hub.permanent(e, adapter.name, adapter.revision, hub.adapter_fields(index))
            if refused is not None:
                raise refused from None
            if not (local or isinstance(e, _MISFITS)):
                raise  # a network error: retried with the pod
            reason = f"{type(e).__name__}: {e}".splitlines()[0][:400]
            raise PermanentFailure(f"{ADAPTERS_FIELD}[{index}]",
                                   f"LoRA {adapter.name!r} does not fit {type(pipe).__name__}: {reason}") from None
        names.append(name)
    pipe.set_adapters(names, adapter_weights=[a.scale for a in adapters])
    described = ", ".join(f"{a.name} x{a.scale:g}" for a in adapters)
    if fuse:
        # Merged into the base weights (scales included), then the LoRA layers are dropped:
        # plain Linear layers again, as a tensor-parallel plan and torch.compile want them.
        pipe.fuse_lora(adapter_names=names)
        pipe.unload_lora_weights()
        return f"LoRA adapters fused: {described}"
    return f"LoRA adapters: {described}"


# -- scheduler -----------------------------------------------------------------------------------

SCHEDULER_FIELD = "spec.generation.scheduler"


def set_scheduler(pipe: Any, wanted: SchedulerSpec) -> str:
    """`pipe.scheduler = <name>.from_config(pipe.scheduler.config, **config)`."""
    import diffusers

    cls = getattr(diffusers, wanted.name, None)
    if cls is None or not hasattr(cls, "from_config"):
        raise PermanentFailure(f"{SCHEDULER_FIELD}.name", f"diffusers has no scheduler {wanted.name!r}")
    accepted = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(wanted.config) - set(accepted))
    if unknown:
        # from_config would drop them with a log line; a typo must not go unnoticed.
        raise PermanentFailure(f"{SCHEDULER_FIELD}.config.{unknown[0]}",
                               f"{wanted.name} takes no {unknown[0]!r}; it takes "
                               f"{', '.join(k for k in accepted if k not in ('self', 'kwargs'))}")
    try:
        scheduler = cls.from_config(pipe.scheduler.config, **wanted.config)
    except (ValueError, TypeError, NotImplementedError, KeyError) as e:
        raise PermanentFailure(f"{SCHEDULER_FIELD}.config",
                               f"{wanted.name} refuses this config: {type(e).__name__}: {e}".splitlines()[0]) from None
    _check_timesteps(pipe, scheduler, wanted.name)
    pipe.scheduler = scheduler
    return f"scheduler {wanted.name}" + (f" {dict(wanted.config)}" if wanted.config else "")


def _check_timesteps(pipe: Any, scheduler: Any, name: str) -> None:
    """Pipelines that pass custom sigmas (and Flux's `mu`) to set_timesteps need a scheduler that
    takes them: diffusers' retrieve_timesteps raises at the first image otherwise."""
    try:
        source = inspect.getsource(type(pipe).__call__)
    except (OSError, TypeError) as e:
        log.warning("%s: cannot read %s.__call__'s source (%s); not checking that %s takes the sigmas or mu it "
                    "may pass", f"{SCHEDULER_FIELD}.name", type(pipe).__name__, e, name)
        return
    takes = inspect.signature(scheduler.set_timesteps).parameters
    kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values())
    for needed in ("sigmas", "mu"):
        if f"{needed}={needed}" in source and needed not in takes and not kwargs:
            raise PermanentFailure(f"{SCHEDULER_FIELD}.name",
                                   f"{type(pipe).__name__} passes {needed!r} to its scheduler and {name}'s "
                                   "set_timesteps takes none; use a flow-matching scheduler (e.g. "
                                   "FlowMatchEulerDiscreteScheduler, or UniPCMultistepScheduler with "
                                   "use_flow_sigmas: true)")
