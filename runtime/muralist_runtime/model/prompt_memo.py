"""The text encoders' output for a prompt this rank has encoded already, kept and given again.

Jobs repeat prompts: a restyle job sends one prompt with every photo of a catalog, a seed sweep sends each
prompt with many seeds, a data set of prompts has duplicates. A pipeline call encodes its prompts again every
time (`encode_prompt`: the tokenizers and the text encoders), which for the trained tiny Flux on one CPU thread
is 1.9 ms of a ~16 ms compiled item (200 calls timed). The encoders are deterministic, so an encoding given
again is the one the call would have computed: the images stay bit for bit the same
(tests/unit/runtime/model/test_prompt_memo.py).

A call is looked up by all its arguments, bound to the method's signature, when they are all plain values
(strings, numbers, None, devices, dtypes and lists of these); a call given tensors (`prompt_embeds=...`)
encodes as it would. A batch is one key (its prompts in order: encoding a batch is not the same arithmetic as
encoding its prompts one by one). What is kept is bounded by bytes, the least recently used dropped first
(MEMO_BYTES: 8 encodings of FLUX.1-dev's 512 T5 tokens in bfloat16; thousands of the tiny model's). Each call
gets its own copies, so that nothing a pipeline does to its embeddings reaches the next item.

The pipeline gets it as a member of its settled twin (settled.py), like the look-ups found once.
"""

from __future__ import annotations

import functools
import inspect
from collections import OrderedDict
from typing import Any

MEMO_BYTES = 64 * 2**20
_MEMO = "_muralist_prompt_memo"


class PromptMemo:
    """Encodings by call key, least recently used first, within `limit` bytes."""

    def __init__(self, limit: int = MEMO_BYTES):
        self.limit, self.size = limit, 0
        self.entries: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: tuple[Any, ...]) -> Any:
        """A copy of the encoding kept for `key`, or None."""
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return _copied(entry[0])

    def put(self, key: tuple[Any, ...], encoding: Any) -> None:
        size = _nbytes(encoding)
        if size > self.limit:
            return
        self.entries[key] = (_copied(encoding), size)
        self.size += size
        while self.size > self.limit:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.size -= dropped


def memoized_encode_prompt(self: Any, *args: Any, **kwargs: Any) -> Any:
    """`encode_prompt` of a settled pipeline: a repeated plain call is given its kept encoding."""
    encode = self._unsettled.encode_prompt
    key = call_key(encode, self, args, kwargs)
    if key is None:
        return encode(self, *args, **kwargs)
    memo: PromptMemo = self.__dict__.setdefault(_MEMO, PromptMemo())
    kept = memo.get(key)
    if kept is not None:
        return kept
    encoding = encode(self, *args, **kwargs)
    memo.put(key, encoding)
    return encoding


def memo_of(pipe: Any) -> PromptMemo | None:
    """The pipeline's memo, once a call has made it."""
    memo: PromptMemo | None = pipe.__dict__.get(_MEMO)
    return memo


def call_key(method: Any, pipe: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The call's arguments as a key (bound to `method`'s signature, defaults filled in), or None when one is
    not a plain value."""
    try:
        bound = _signature(method).bind(pipe, *args, **kwargs)
    except TypeError:
        return None  # the method will say what is wrong with the call
    bound.apply_defaults()
    parts = []
    for name, value in list(bound.arguments.items())[1:]:
        plain = _plain(value)
        if plain is _NOT_PLAIN:
            return None
        parts.append((name, plain))
    return tuple(parts)


_NOT_PLAIN = object()


@functools.lru_cache(maxsize=32)
def _signature(method: Any) -> inspect.Signature:
    return inspect.signature(method)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | bool | int | float):
        return (type(value).__name__, value)
    if isinstance(value, list | tuple):
        items = tuple(_plain(v) for v in value)
        return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items) else ("seq", items)
    if isinstance(value, dict):
        entries = tuple((k, _plain(v)) for k, v in sorted(value.items()) if isinstance(k, str))
        if len(entries) != len(value) or any(v is _NOT_PLAIN for _, v in entries):
            return _NOT_PLAIN
        return ("dict", entries)
    kind = type(value).__name__
    if type(value).__module__ == "torch" and kind in ("device", "dtype"):
        return (kind, str(value))
    return _NOT_PLAIN


def _copied(encoding: Any) -> Any:
    import torch

    if isinstance(encoding, torch.Tensor):
        return encoding.clone()
    if type(encoding) in (tuple, list):
        return type(encoding)(_copied(e) for e in encoding)
    return encoding


def _nbytes(encoding: Any) -> int:
    import torch

    if isinstance(encoding, torch.Tensor):
        return int(encoding.numel() * encoding.element_size())
    if type(encoding) in (tuple, list):
        return sum(_nbytes(e) for e in encoding)
    return 0
