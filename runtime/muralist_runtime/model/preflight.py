"""Pre-flight of a ContextParallel layout against the model's config files, before loading.

The rules (which lengths must divide what, and diffusers' uneven modes) live in the catalog
(`muralist_api.rules.sequence`); this module reads the small config files they need (model_index.json, the
transformer's and the VAE's config.json), from a local model directory or the hub, and asks
diffusers two things that only its classes know, without loading any weights: which inputs the
transformer's `_cp_plan` splits (Flux: image and text tokens; Wan: only the video tokens), and
the pipeline's defaults for `num_frames` and `max_sequence_length`. Importing this module
loads no torch: diffusers is imported only when a class is looked up.

The pre-flight is a head start, not a gate: when a config cannot be read (a gated repo without
a token, a network error, a file that is not JSON) it is skipped, and says so once, naming the
model and the error; loading the weights then reports the real problem. A config that the
model simply does not have (a local folder or a hub repo without that file) is not an error:
that is logged at debug level only.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from pathlib import Path
from typing import Any

from muralist_api.job import Generation
from muralist_api.rules.sequence import (
    DEFAULT_TEXT_TOKENS,
    Verdict,
    cp_problems,
    patch_size,
    sequence_lengths,
    temporal_patch,
    text_tokens,
    token_frames,
    vae_scales,
)

from . import hub

log = logging.getLogger("muralist")

# -- reading the configs (local directory or small hub downloads) ------------------------------


class ConfigUnreadable(Exception):
    """A config file that may well exist but could not be read; the message says which and why."""


def read_json(source: str, filename: str, subfolder: str = "", revision: str | None = None) -> dict[str, Any] | None:
    """`<subfolder>/<filename>` of a local model directory or a hub repo; None when the model has
    no such file. Raises ConfigUnreadable when it could not be read."""
    name = f"{subfolder}/{filename}" if subfolder else filename
    if Path(source).is_dir():
        local = Path(source) / subfolder / filename
        if not local.is_file():
            return None
        path = local
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

        try:
            path = Path(hf_hub_download(source, filename, subfolder=subfolder or None, revision=revision,
                                        token=hub.token()))
        except EntryNotFoundError as e:
            if isinstance(e, LocalEntryNotFoundError):  # not cached, and the hub not reachable
                raise ConfigUnreadable(f"{name}: {_error(e)}") from e
            return None  # the repo has no such file
        except Exception as e:  # gated or private without a token, a network error, a bad revision...
            raise ConfigUnreadable(f"{name}: {_error(e)}") from e
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigUnreadable(f"{name}: {_error(e)}") from e
    return config


def _error(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def read_config(source: str, subfolder: str, revision: str | None = None) -> dict[str, Any] | None:
    return read_json(source, "config.json", subfolder, revision)


# -- what diffusers' classes say -----------------------------------------------------------------


@functools.cache
def _diffusers_class(name: Any) -> Any:
    """diffusers' class of that name; None when there is none (a custom class: no facts from it)
    or it cannot be imported (an optional dependency missing: said once per class)."""
    if not isinstance(name, str) or not name:
        return None
    try:
        import diffusers

        return getattr(diffusers, name, None)
    except Exception as e:
        log.warning("context-parallel pre-flight: cannot import diffusers.%s (%s); assuming its defaults and "
                    "that its text sequence is split", name, _error(e))
        return None


def cp_split_inputs(transformer_class: str) -> set[str] | None:
    """The input names a transformer class's `_cp_plan` splits (None: class or plan unknown)."""
    cls = _diffusers_class(transformer_class)
    plan = getattr(cls, "_cp_plan", None)
    if not isinstance(plan, dict):
        return None
    from diffusers.models._modeling_parallel import ContextParallelInput

    names: set[str] = set()
    for entry in plan.values():
        if isinstance(entry, dict):
            names |= {str(k) for k, v in entry.items() if isinstance(v, ContextParallelInput)}
    return names


def call_default(pipeline_class: str | None, parameter: str) -> Any:
    """The default of a pipeline class's __call__ parameter (None when unknown or absent)."""
    cls = _diffusers_class(pipeline_class)
    if cls is None:
        return None
    param = inspect.signature(cls.__call__).parameters.get(parameter)
    if param is None or param.default is inspect.Parameter.empty:
        return None
    return param.default


def check_context_parallel(source: str, revision: str | None, generation: Generation, pipeline: str | None,
                           ring: int, ulysses: int, allow_uneven: bool = True) -> Verdict:
    """The pre-flight verdict for a model (empty when its configs cannot be read).

    `pipeline`: spec.model.pipeline, else the class model_index.json names.
    """
    try:
        transformer = read_config(source, "transformer", revision)
        vae = read_config(source, "vae", revision)
        if transformer is None or vae is None:
            log.debug("context-parallel pre-flight: model %r has no %s config; nothing to check", source,
                      "transformer" if transformer is None else "vae")
            return Verdict([])
        if not pipeline:
            index = read_json(source, "model_index.json", revision=revision) or {}
            pipeline = index.get("_class_name")
    except ConfigUnreadable as e:
        log.warning("context-parallel pre-flight skipped for model %r: cannot read %s; the sequence lengths are "
                    "not checked before the weights load (which reports its own error)", source, e)
        return Verdict([])
    spatial, temporal = vae_scales(vae)
    patch = patch_size(transformer)
    frames = 1
    if temporal > 1:  # a video VAE: the clip's frames are part of the sequence
        num_frames = generation.num_frames or call_default(pipeline, "num_frames")
        if isinstance(num_frames, int) and num_frames > 0:
            frames = token_frames(num_frames, temporal, temporal_patch(transformer))
    split = cp_split_inputs(str(transformer.get("_class_name", "")))
    text_split = split is None or "encoder_hidden_states" in split  # unknown: assume it is split
    default_text = call_default(pipeline, "max_sequence_length")
    lengths = sequence_lengths(generation.height, generation.width, spatial, patch,
                               text_tokens(generation.extra_args,
                                           default_text if isinstance(default_text, int) else DEFAULT_TEXT_TOKENS),
                               frames, text_split)
    heads = transformer.get("num_attention_heads")
    return cp_problems(lengths, heads if isinstance(heads, int) else None, ring, ulysses, spatial * patch,
                       allow_uneven)
