"""A model's sizes without loading it: the planner's facts (muralist_api.planner.facts) from a local
folder, or from the hub with ranged reads.

A local folder is read by the API's `read_folder` (each safetensors file's header alone). A hub repo
is read the same way through huggingface_hub: its file list, its small JSON files, and each weight
file's header by `HfApi.parse_safetensors_file_metadata` (an HTTP range request for the first
bytes: a 24 GB file costs a few kilobytes). Whether the denoiser class has a context- or
tensor-parallel plan comes from the rules catalog, else from diffusers' class itself when it can
be imported.

`muralist plan` and `muralist run` (planning strategy Auto) read sizes here, a local folder's or a
hub repo's; the pods (confirming a plan, the job file's memory estimate) read a local folder's only.
Importing this module loads neither torch nor the hub client.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from muralist_api.planner.facts import FactsUnreadable, ModelFacts, catalog_plans, read_folder, read_model

from . import hub

log = logging.getLogger("muralist")


def diffusers_plans(transformer_class: str) -> tuple[bool | None, bool | None]:
    """(_cp_plan, _tp_plan) of a denoiser class: the catalog's, else diffusers' class (None: unknown)."""
    cp, tp = catalog_plans(transformer_class)
    if cp is not None:
        return cp, tp
    try:
        import diffusers

        cls = getattr(diffusers, transformer_class, None)
    except Exception:  # no diffusers here (the CLI alone): the catalog's word is all there is
        return None, None
    if cls is None:
        return None, None
    return getattr(cls, "_cp_plan", None) is not None, getattr(cls, "_tp_plan", None) is not None


def read_hub(repo: str, revision: str | None = None, variant: str | None = None) -> ModelFacts:
    """A hub repo's facts: its JSON files and every weight file's header, by ranged reads."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    api = HfApi()
    token = hub.token()
    with hub.hub_errors(repo, revision, hub.MODEL):
        files = api.list_repo_files(repo, revision=revision, token=token)

    def read_json(path: str) -> dict[str, Any] | None:
        if path not in files:
            return None
        try:
            local = hf_hub_download(repo, path, revision=revision, token=token)
            doc = json.loads(Path(local).read_text())
        except EntryNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise FactsUnreadable(f"{repo}/{path}: {e}") from None
        return doc if isinstance(doc, dict) else None

    def read_header(path: str) -> dict[str, Any]:
        meta = api.parse_safetensors_file_metadata(repo, path, revision=revision, token=token)
        return {name: {"dtype": info.dtype, "shape": list(info.shape)} for name, info in meta.tensors.items()}

    return read_model(repo, files, read_json, read_header, f"the hub's safetensors metadata of {repo}", variant,
                      diffusers_plans)


def read_facts(source: str, revision: str | None = None, variant: str | None = None) -> ModelFacts:
    """A local folder's facts, else a hub repo's; raises FactsUnreadable (or the hub's refusal)."""
    if Path(source).is_dir():
        return read_folder(source, variant, diffusers_plans)
    return read_hub(source, revision, variant)


def try_read_facts(source: str, revision: str | None = None, variant: str | None = None) -> ModelFacts | None:
    """read_facts, or None with one line saying why (a model whose sizes cannot be read still runs)."""
    try:
        return read_facts(source, revision, variant)
    except Exception as e:  # sizes are an estimate's input, never a reason to stop here
        log.warning("cannot read the sizes of model %r (%s: %s); its memory is not estimated", source,
                    type(e).__name__, str(e)[:300])
        return None
