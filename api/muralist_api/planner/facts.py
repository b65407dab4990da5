"""What the planner knows of a model without loading it: each component's size, the denoiser's shape.

Sizes come from safetensors headers alone (an 8-byte little-endian length, then a JSON object of
tensor names to dtype and shape): the header of a 24 GB file is a few kilobytes, and it says every
tensor's element count exactly. A local folder is read here (`read_folder`); a hub repo the same
way through `read_model`, handed readers that make ranged requests (the runtime's
model/sizes.py, with huggingface_hub). The denoiser's heads, layers, widths and patching come
from its config.json; whether diffusers has a context- or tensor-parallel plan for it from the
rules catalog (or, where diffusers is importable, from the class itself: the caller passes it).

Floating-point tensors are counted as parameters (diffusers casts them to the job's dtype when it
loads them); others (quantised or integer) keep their stored size.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from muralist_api.rules.catalog import MODEL_LAYOUTS

# Bytes per element of each safetensors dtype.
DTYPE_BYTES: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F6_E2M3": 1,
    "F6_E3M2": 1, "F4": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
    "BOOL": 1,
}
# Cast to the job's dtype by from_pretrained(torch_dtype=...).
CAST_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
JOB_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# The most a header may claim: a corrupt length must not make a reader allocate gigabytes.
MAX_HEADER_BYTES = 100_000_000
DENOISERS = ("transformer", "unet", "prior")


class FactsUnreadable(Exception):
    """A model's files that do not say what the planner needs; the message names the file and why."""


@dataclass(frozen=True)
class Component:
    """One component of a pipeline with weights (a transformer, a text encoder, the VAE)."""

    name: str
    class_name: str
    parameters: int  # floating-point elements, loaded at the job's dtype
    other_bytes: int = 0  # quantised or integer tensors, loaded as stored
    config: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def bytes_at(self, dtype: str) -> int:
        return self.parameters * JOB_DTYPE_BYTES[dtype] + self.other_bytes


@dataclass(frozen=True)
class ModelFacts:
    """A pipeline as the planner sees it; `source` says where the figures came from."""

    name: str
    pipeline: str | None
    components: tuple[Component, ...]
    source: str
    cp_plan: bool | None = None  # the denoiser class has a _cp_plan in diffusers (None: unknown)
    tp_plan: bool | None = None

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    @property
    def denoiser(self) -> Component | None:
        return next((c for name in DENOISERS if (c := self.component(name)) is not None), None)

    @property
    def vae(self) -> Component | None:
        return self.component("vae")

    def total_bytes(self, dtype: str) -> int:
        return sum(c.bytes_at(dtype) for c in self.components)

    @property
    def heads(self) -> int | None:
        value = (self.denoiser.config if self.denoiser else {}).get("num_attention_heads")
        return value if isinstance(value, int) and value > 0 else None

    @property
    def hidden(self) -> int | None:
        """The denoiser's token width: heads x head dim (a transformer), or its widest block (a UNet)."""
        config = self.denoiser.config if self.denoiser else {}
        heads, dim = config.get("num_attention_heads"), config.get("attention_head_dim")
        if isinstance(heads, int) and isinstance(dim, int):
            return heads * dim
        channels = config.get("block_out_channels")
        if isinstance(channels, list) and channels:
            return int(channels[0])
        width = config.get("hidden_size") or config.get("inner_dim")
        return width if isinstance(width, int) else None

    @property
    def ffn(self) -> int | None:
        """The width of the denoiser's feed-forward layer (ffn_dim, else mlp_ratio x hidden, else 4 x)."""
        config = self.denoiser.config if self.denoiser else {}
        hidden = self.hidden
        if isinstance(config.get("ffn_dim"), int):
            return int(config["ffn_dim"])
        if hidden is None:
            return None
        ratio = config.get("mlp_ratio", 4.0)
        return int(hidden * (ratio if isinstance(ratio, int | float) else 4.0))


# -- reading safetensors headers ------------------------------------------------------------------


def header_from_bytes(data: bytes, name: str) -> dict[str, Any]:
    """A safetensors header from the file's first bytes (at least 8 + its length)."""
    if len(data) < 8:
        raise FactsUnreadable(f"{name}: shorter than a safetensors header (8 bytes)")
    (length,) = struct.unpack("<Q", data[:8])
    if length > MAX_HEADER_BYTES:
        raise FactsUnreadable(f"{name}: header length {length} is not a safetensors header's")
    if len(data) < 8 + length:
        raise FactsUnreadable(f"{name}: the header says {length} bytes, {len(data) - 8} are there")
    try:
        header = json.loads(data[8:8 + length])
    except ValueError as e:
        raise FactsUnreadable(f"{name}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise FactsUnreadable(f"{name}: the header is not a JSON object")
    return header


def read_header(path: Path) -> dict[str, Any]:
    """The header of a local safetensors file, reading the header alone (never the tensors)."""
    try:
        with path.open("rb") as f:
            start = f.read(8)
            if len(start) < 8:
                raise FactsUnreadable(f"{path}: shorter than a safetensors header (8 bytes)")
            (length,) = struct.unpack("<Q", start)
            if length > MAX_HEADER_BYTES:
                raise FactsUnreadable(f"{path}: header length {length} is not a safetensors header's")
            return header_from_bytes(start + f.read(length), str(path))
    except OSError as e:
        raise FactsUnreadable(f"{path}: {e.strerror or e}") from None


def tensor_counts(header: Mapping[str, Any], name: str) -> tuple[int, int]:
    """(floating-point elements, bytes of the other tensors) of one header."""
    parameters = other = 0
    for key, tensor in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(tensor, dict) or not isinstance(tensor.get("shape"), list):
            raise FactsUnreadable(f"{name}: tensor {key!r} has no shape")
        dtype = str(tensor.get("dtype"))
        if dtype not in DTYPE_BYTES:
            raise FactsUnreadable(f"{name}: tensor {key!r} has dtype {dtype!r}, not a safetensors dtype")
        count = 1
        for side in tensor["shape"]:
            count *= int(side)
        if dtype in CAST_DTYPES:
            parameters += count
        else:
            other += count * DTYPE_BYTES[dtype]
    return parameters, other


# -- a pipeline's files --------------------------------------------------------------------------

JsonReader = Callable[[str], dict[str, Any] | None]  # a file of the model by its path; None when absent
HeaderReader = Callable[[str], dict[str, Any]]


def weight_files(files: Iterable[str], component: str, read_json: JsonReader,
                 variant: str | None = None) -> list[str]:
    """The safetensors files from_pretrained loads for one component: those its index names, else the
    files without a variant (or of `variant`)."""
    inside = sorted(f for f in files if PurePosixPath(f).parent == PurePosixPath(component))
    def is_index(f: str) -> bool:
        leaf = PurePosixPath(f).name
        if variant:
            return leaf.endswith(f".{variant}.safetensors.index.json")
        return leaf.endswith(".safetensors.index.json") and leaf.count(".") == 3

    for index in filter(is_index, inside):
        doc = read_json(index) or {}
        shards = sorted(set((doc.get("weight_map") or {}).values()))
        if shards:
            return [str(PurePosixPath(component) / s) if component else s for s in shards]
    tensors = [f for f in inside if f.endswith(".safetensors")]
    plain = [f for f in tensors if PurePosixPath(f).name.count(".") == 1]
    if variant:
        return [f for f in tensors if PurePosixPath(f).name.endswith(f".{variant}.safetensors")] or plain
    return plain or tensors


def read_model(name: str, files: Iterable[str], read_json: JsonReader, read_header: HeaderReader, source: str,
               variant: str | None = None, plans: Callable[[str], tuple[bool | None, bool | None]] | None = None,
               ) -> ModelFacts:
    """A pipeline's facts from its file list and two readers (a local folder's, or the hub's).

    `plans(transformer_class)`: whether diffusers has a (_cp_plan, _tp_plan) for it; default the
    rules catalog's table."""
    files = list(files)
    index = read_json("model_index.json")
    if index is None:
        raise FactsUnreadable(f"{name}: no model_index.json (not a diffusers pipeline folder)")
    components: list[Component] = []
    for component, spec in index.items():
        if component.startswith("_") or not isinstance(spec, list) or len(spec) != 2:
            continue
        shards = weight_files(files, component, read_json, variant)
        if not shards:
            continue  # a tokenizer, a scheduler: no weights
        parameters = other = 0
        for shard in shards:
            p, o = tensor_counts(read_header(shard), shard)
            parameters, other = parameters + p, other + o
        config = read_json(f"{component}/config.json") or {}
        components.append(Component(component, str(spec[1] or config.get("_class_name") or ""), parameters, other,
                                    config))
    if not components:
        raise FactsUnreadable(f"{name}: no component has safetensors weights")
    facts = ModelFacts(name, str(index.get("_class_name") or "") or None, tuple(components), source)
    denoiser = facts.denoiser
    if denoiser is None:
        return facts
    cp, tp = (plans or catalog_plans)(denoiser.class_name)
    return ModelFacts(facts.name, facts.pipeline, facts.components, facts.source, cp, tp)


def catalog_plans(transformer_class: str) -> tuple[bool | None, bool | None]:
    """(_cp_plan, _tp_plan) as the rules catalog knows them for a denoiser class; (None, None) unknown."""
    for layout in MODEL_LAYOUTS.values():
        if layout.transformer == transformer_class:
            return layout.context_parallel, layout.tensor_parallel
    return None, None


def read_folder(path: str | Path, variant: str | None = None,
                plans: Callable[[str], tuple[bool | None, bool | None]] | None = None) -> ModelFacts:
    """A local pipeline folder's facts, from its JSON files and its safetensors headers alone."""
    root = Path(path)
    if not root.is_dir():
        raise FactsUnreadable(f"{root}: not a directory")
    files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]

    def read_json(relative: str) -> dict[str, Any] | None:
        local = root / relative
        if not local.is_file():
            return None
        try:
            doc = json.loads(local.read_text())
        except (OSError, ValueError) as e:
            raise FactsUnreadable(f"{local}: {e}") from None
        return doc if isinstance(doc, dict) else None

    return read_model(str(root), files, read_json, lambda relative: read_header(root / relative),
                      f"the safetensors headers in {root}", variant, plans)
