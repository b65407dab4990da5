"""Pre-flight of a ContextParallel layout against the model's config files, before loading.

The rules (which lengths must divide what, and diffusers' uneven modes) live in the catalog
(`spec.sequence`); this module reads the small config files they need (model_index.json, the
transformer's and the VAE's config.json), from a local model directory or the hub, and asks
diffusers two things that only its classes know, without loading any weights: which inputs the
transformer's `_cp_plan` splits (Flux: image and text tokens; Wan: only the video tokens), and
the pipeline's defaults for `num_frames` and `max_sequence_length`. Importing this module
loads no torch: diffusers is imported only when a class is looked up.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from pathlib import Path
from typing import Any

from .spec.api import Generation
from .spec.sequence import (
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

log = logging.getLogger("muralist")

# -- reading the configs (local directory or small hub downloads) ------------------------------


def read_json(source: str, filename: str, subfolder: str = "", revision: str | None = None) -> dict[str, Any] | None:
    """`<subfolder>/<filename>` of a local model directory or a hub repo; None when absent."""
    if Path(source).is_dir():
        local = Path(source) / subfolder / filename
        return json.loads(local.read_text()) if local.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(source, filename, subfolder=subfolder or None, revision=revision,
                               token=os.environ.get("HF_TOKEN") or None)
    except Exception:  # no config, no check: loading reports the real error
        return None
    return json.loads(Path(path).read_text())


def read_config(source: str, subfolder: str, revision: str | None = None) -> dict[str, Any] | None:
    return read_json(source, "config.json", subfolder, revision)


# -- what diffusers' classes say -----------------------------------------------------------------


def _diffusers_class(name: Any) -> Any:
    if not isinstance(name, str) or not name:
        return None
    try:
        import diffusers

        return getattr(diffusers, name, None)
    except Exception:  # an optional dependency of that class missing: no facts from it
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
    transformer = read_config(source, "transformer", revision)
    vae = read_config(source, "vae", revision)
    if transformer is None or vae is None:
        return Verdict([])
    if not pipeline:
        index = read_json(source, "model_index.json", revision=revision) or {}
        pipeline = index.get("_class_name")
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
