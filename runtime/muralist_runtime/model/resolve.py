"""The model a job names, resolved to what `from_pretrained` takes: before the world exists (plan/).

A model is a hub repo id (with revision and HF_TOKEN), a local directory, or a built-in tiny
name (muralist_api.rules.catalog.TINY_MODEL_NAMES): a random one is built in place into a cache
directory first (tiny.py), a trained one is read from the runtime package (bundled.py); either is
then loaded exactly like a local directory (loading.py). `RuntimeSpec.model_path` (muralist run
--model) replaces the name with a local directory. The hub's refusals (gated, no such repo, revision
or file) are permanent failures naming the field (hub.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from muralist_api.contract import PermanentFailure
from muralist_api.contract.env import PodEnv
from muralist_api.rules.catalog import TINY_MODEL_NAMES
from muralist_api.runtime_spec import RuntimeSpec

from . import hub
from .bundled import BUNDLED_MODELS, bundled_model
from .tiny import build_tiny


def tiny_cache_dir(name: str) -> Path:
    """Where a built-in tiny model is built: MURALIST_TINY_MODELS, else under HF_HOME, else ~/.cache."""
    env = PodEnv.from_environ()
    base = env.tiny_models_dir
    if base is None:
        base = os.path.join(env.hf_home, "muralist") if env.hf_home else os.path.expanduser(
            "~/.cache/muralist/models")
    return Path(base) / name.replace("/", "--")


def resolve_model(runtime: RuntimeSpec) -> tuple[str, str | None]:
    """(what to pass to from_pretrained, revision); builds a tiny model when one is named, and
    checks that the hub serves a hub id (its model_index.json, with the token).

    Call it before torch.distributed is initialised: transformers' save_pretrained writes
    nothing on ranks other than 0 once a process group exists, so a build racing on rank 1
    would miss its text encoders.
    """
    model = runtime.spec.model
    if runtime.model_path:
        return runtime.model_path, None
    if model.name in BUNDLED_MODELS:
        return str(bundled_model(model.name)), None
    if model.name in TINY_MODEL_NAMES:
        directory = tiny_cache_dir(model.name)
        return str(build_tiny(model.name, directory)), None
    if model.name.startswith("/") and not Path(model.name).is_dir():
        raise PermanentFailure("spec.model.name", f"{model.name} is not a directory in the pod")
    if not Path(model.name).is_dir():
        # The first file from_pretrained reads, fetched now: a repo that is gated, missing or
        # without that revision fails the pod here, in seconds, not after the world is up.
        from huggingface_hub import hf_hub_download

        with hub.hub_errors(model.name, model.revision, hub.MODEL):
            hf_hub_download(model.name, "model_index.json", revision=model.revision, token=hub.token())
    return model.name, model.revision
