"""What a diffusers pipeline looks up at every call, found once for a loaded pipeline.

A pipeline call asks for its execution device (`_execution_device`: every module of every component searched
for offloading hooks) and for a component's (`get_module_execution_device`: Flux asks for its VAE's) and, for a
pipeline that can load textual inversions, rewrites each prompt for multi-vector tokens (`maybe_convert_prompt`:
the prompt tokenized once more, and the tokenizer's table of added tokens rebuilt for each of its tokens). For
the trained tiny Flux on a CPU that was 1.2 ms, 1 ms and 0.7 ms of a 20 ms compiled item (py-spy, measured).
Once loaded, a pipeline's placement is final (strategies.py places it, nothing moves it after) and the runtime
loads no textual inversion, so the answers are known: the pipeline gets its class's twin (`settle`), which gives
them without looking, and its components' devices are noted for the lookup of its module. The twin's
`encode_prompt` also gives a prompt encoded already its kept encoding (prompt_memo.py). Nothing else of the
class changes: its name, signature and behaviour (model/denoising.py's resumable twin is made the same way, on
top).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from . import prompt_memo

_SETTLED: dict[type, type] = {}
_DEVICE = "_muralist_execution_device"
_PLAIN_TOKENIZERS = "_muralist_plain_tokenizers"
_DEVICE_LOOKUP = "get_module_execution_device"  # diffusers.utils.torch_utils', imported by name by the pipelines
_LOOKED_UP = "_muralist_looks_up"  # the settled lookup's original
# Components of settled pipelines and their execution devices (weak: a pipeline let go of takes its own along).
_COMPONENT_DEVICES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def settle(pipe: Any) -> None:
    """Give `pipe` its class's settled twin, with its execution device and its tokenizers without multi-vector
    tokens noted (a second call changes nothing)."""
    base = type(pipe)
    if base in _SETTLED.values() or not isinstance(getattr(base, "_execution_device", None), property):
        return
    # In the instance's own dict: past DiffusionPipeline.__setattr__, which registers what it is given.
    pipe.__dict__[_DEVICE] = pipe._execution_device
    pipe.__dict__[_PLAIN_TOKENIZERS] = {id(t) for t in _tokenizers(pipe) if not _multi_vector_tokens(t)}
    _settle_component_devices(pipe, sys.modules.get(base.__module__))
    if base not in _SETTLED:
        members: dict[str, Any] = {"_execution_device": property(_execution_device), "_unsettled": base}
        if hasattr(base, "maybe_convert_prompt"):
            members["maybe_convert_prompt"] = _maybe_convert_prompt
        if callable(getattr(base, "encode_prompt", None)):
            members["encode_prompt"] = prompt_memo.memoized_encode_prompt
        _SETTLED[base] = twin_class(base, members)
    pipe.__class__ = _SETTLED[base]


def _settle_component_devices(pipe: Any, pipeline_module: Any) -> None:
    """The pipeline's module asks `get_module_execution_device(component)` at every call (Flux: of the VAE,
    every one of its 185 modules searched for offloading hooks, 1 ms); its components' answers are noted, and
    the module's function gives them without looking. Any other module is looked up as before."""
    lookup = getattr(pipeline_module, _DEVICE_LOOKUP, None)
    if lookup is None:
        return
    original = getattr(lookup, _LOOKED_UP, lookup)
    if lookup is original:
        def settled_lookup(module: Any) -> Any:
            device = _COMPONENT_DEVICES.get(module)
            return original(module) if device is None else device

        setattr(settled_lookup, _LOOKED_UP, original)
        setattr(pipeline_module, _DEVICE_LOOKUP, settled_lookup)
    for component in vars(pipe).values():
        if callable(getattr(component, "modules", None)) and callable(getattr(component, "parameters", None)):
            _COMPONENT_DEVICES[component] = original(component)


def twin_class(base: type, members: dict[str, Any]) -> type:
    """A subclass of `base` with `members` replaced, that passes for `base`: the same name, module, qualified
    name and docstring (a pipeline's class name is what diffusers and the job file go by)."""
    return type(base.__name__, (base,), {**members, "__module__": base.__module__, "__qualname__": base.__qualname__,
                                         "__doc__": base.__doc__})


def _tokenizers(pipe: Any) -> list[Any]:
    return [value for value in vars(pipe).values() if hasattr(value, "added_tokens_encoder")]


def _multi_vector_tokens(tokenizer: Any) -> list[str]:
    """The added tokens that stand for several vectors (`<t>` with `<t>_1` beside it): the only ones
    maybe_convert_prompt rewrites a prompt for."""
    added = tokenizer.added_tokens_encoder
    return [token for token in added if f"{token}_1" in added]


def _execution_device(self: Any) -> Any:
    return self.__dict__[_DEVICE]


def _maybe_convert_prompt(self: Any, prompt: Any, tokenizer: Any) -> Any:
    if id(tokenizer) in self.__dict__[_PLAIN_TOKENIZERS]:
        return prompt  # what diffusers would return: it rewrites a prompt for multi-vector tokens only
    return self._unsettled.maybe_convert_prompt(self, prompt, tokenizer)
