"""What a diffusers pipeline looks up at every call, found once for a loaded pipeline.

A pipeline call asks for its execution device (`_execution_device`: every module of every component searched
for offloading hooks) and, for a pipeline that can load textual inversions, rewrites each prompt for
multi-vector tokens (`maybe_convert_prompt`: the prompt tokenized once more, and the tokenizer's table of added
tokens rebuilt for each of its tokens). For the trained tiny Flux on a CPU that was 1.2 ms and 0.7 ms of a
20 ms compiled item (py-spy, measured). Once loaded, a pipeline's placement is final (strategies.py places
it, nothing moves it after) and the runtime loads no textual inversion, so both answers are known: the pipeline
gets its class's twin (`settle`), which gives them without looking. Nothing else of the class changes: its
name, signature and behaviour (model/denoising.py's resumable twin is made the same way, on top).
"""

from __future__ import annotations

from typing import Any

_SETTLED: dict[type, type] = {}
_DEVICE = "_muralist_execution_device"
_PLAIN_TOKENIZERS = "_muralist_plain_tokenizers"


def settle(pipe: Any) -> None:
    """Give `pipe` its class's settled twin, with its execution device and its tokenizers without multi-vector
    tokens noted (a second call changes nothing)."""
    base = type(pipe)
    if base in _SETTLED.values() or not isinstance(getattr(base, "_execution_device", None), property):
        return
    # In the instance's own dict: past DiffusionPipeline.__setattr__, which registers what it is given.
    pipe.__dict__[_DEVICE] = pipe._execution_device
    pipe.__dict__[_PLAIN_TOKENIZERS] = {id(t) for t in _tokenizers(pipe) if not _multi_vector_tokens(t)}
    if base not in _SETTLED:
        members: dict[str, Any] = {"_execution_device": property(_execution_device)}
        if hasattr(base, "maybe_convert_prompt"):
            members["maybe_convert_prompt"] = _maybe_convert_prompt
            members["_unsettled"] = base
        _SETTLED[base] = twin_class(base, members)
    pipe.__class__ = _SETTLED[base]


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
