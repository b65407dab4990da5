"""Pre-flight of a ContextParallel layout against the model's config files, before loading.

The rules (which lengths must divide what, and diffusers' uneven modes) live in the catalog
(`spec.sequence`); this module reads the two small config.json files they need, from a local
model directory or the hub.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .spec.sequence import Verdict, cp_problems, patch_size, sequence_lengths, text_tokens, vae_scale_factor

# -- reading the configs (local directory or two small hub downloads) -----------------------


def read_config(source: str, subfolder: str, revision: str | None = None) -> dict[str, Any] | None:
    """`<subfolder>/config.json` of a local model directory or a hub repo; None when absent."""
    local = Path(source) / subfolder / "config.json"
    if Path(source).is_dir():
        return json.loads(local.read_text()) if local.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(source, "config.json", subfolder=subfolder, revision=revision,
                               token=os.environ.get("HF_TOKEN") or None)
    except Exception:  # no config, no check: loading reports the real error
        return None
    return json.loads(Path(path).read_text())


def check_context_parallel(source: str, revision: str | None, height: int, width: int,
                           extra_args: dict[str, Any], ring: int, ulysses: int,
                           allow_uneven: bool = True) -> Verdict:
    """The pre-flight verdict for a model (empty when its configs cannot be read)."""
    transformer = read_config(source, "transformer", revision)
    vae = read_config(source, "vae", revision)
    if transformer is None or vae is None:
        return Verdict([])
    side = vae_scale_factor(vae) * patch_size(transformer)
    lengths = sequence_lengths(height, width, vae_scale_factor(vae), patch_size(transformer),
                               text_tokens(extra_args))
    heads = transformer.get("num_attention_heads")
    return cp_problems(lengths, heads if isinstance(heads, int) else None, ring, ulysses, side,
                       allow_uneven)
