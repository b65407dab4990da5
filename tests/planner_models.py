"""Hub-shaped model folders with the public checkpoints' real sizes, a few kilobytes each on disk.

Each component's weights are "sparse" safetensors files: the 8-byte header length, a JSON header whose
tensors have the real element counts and dtypes (muralist_api.planner.known's figures, split into a few
tensors and, for the large ones, into shards with an index as the hub's are), then the file truncated to
its full length, so its size is a 24 GB file's while the disk holds its header alone. Anything that only
reads headers (the planner, the hub's ranged metadata reads) sees the real model. Never load one.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from muralist_api.planner.facts import DTYPE_BYTES
from muralist_api.planner.known import KNOWN_MODELS, KnownComponent, KnownModel

SHARD_ELEMENTS = 2_500_000_000  # elements per shard file, about the hub's 5 GB shards in bf16
WEIGHTS = {"transformer": "diffusion_pytorch_model", "unet": "diffusion_pytorch_model",
           "vae": "diffusion_pytorch_model"}
LIBRARY = {"transformer": "diffusers", "unet": "diffusers", "vae": "diffusers", "scheduler": "diffusers"}


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file of these (dtype, shape) tensors whose data is a hole."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for side in shape:
            count *= side
        size = count * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)


def _tensors(parameters: int, dtype: str, first: int) -> dict[str, tuple[str, list[int]]]:
    """`parameters` elements as 2-D blocks of a 4096-wide model plus a 1-D remainder."""
    width = 4096
    rows, rest = divmod(parameters, width)
    out: dict[str, tuple[str, list[int]]] = {}
    block = 0
    while rows:
        take = min(rows, 65_536)
        out[f"blocks.{first + block}.weight"] = (dtype, [take, width])
        rows -= take
        block += 1
    if rest:
        out[f"blocks.{first + block}.bias"] = (dtype, [rest])
    return out


def write_component(root: Path, component: KnownComponent) -> None:
    folder = root / component.name
    folder.mkdir(parents=True, exist_ok=True)
    base = WEIGHTS.get(component.name, "model")
    (folder / "config.json").write_text(json.dumps({"_class_name": component.class_name, **component.config}))
    shards = max(1, -(-component.parameters // SHARD_ELEMENTS))
    if shards == 1:
        write_sparse_safetensors(folder / f"{base}.safetensors", _tensors(component.parameters, component.stored, 0))
        return
    weight_map: dict[str, str] = {}
    left, first = component.parameters, 0
    for shard in range(shards):
        name = f"{base}-{shard + 1:05d}-of-{shards:05d}.safetensors"
        tensors = _tensors(min(left, SHARD_ELEMENTS), component.stored, first)
        write_sparse_safetensors(folder / name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
        left -= min(left, SHARD_ELEMENTS)
        first += len(tensors)
    (folder / f"{base}.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_model(root: Path, model: KnownModel) -> Path:
    """The pipeline folder of `model` under `root`: model_index.json, each component's config and sparse weights,
    a tokenizer and a scheduler folder without weights (as the hub's)."""
    root.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {"_class_name": model.pipeline, "_diffusers_version": "0.42.1",
                             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
                             "tokenizer": ["transformers", "CLIPTokenizer"]}
    for component in model.components:
        index[component.name] = [LIBRARY.get(component.name, "transformers"), component.class_name]
        write_component(root, component)
    for folder, file in (("scheduler", "scheduler_config.json"), ("tokenizer", "tokenizer_config.json")):
        (root / folder).mkdir(exist_ok=True)
        (root / folder / file).write_text("{}")
    (root / "model_index.json").write_text(json.dumps(index))
    return root


def write_public_models(root: Path) -> dict[str, Path]:
    """Every public model of the planner's catalog (not the tiny ones) as a folder under `root`, by name."""
    return {name: write_model(root / name.replace("/", "--"), model)
            for name, model in KNOWN_MODELS.items() if not name.startswith("muralist/")}
