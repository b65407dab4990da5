"""A model's facts from its safetensors headers and config files alone (muralist_api.planner.facts)."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
from muralist_api.planner.facts import FactsUnreadable, read_folder, read_header, tensor_counts, weight_files
from muralist_api.planner.known import KNOWN_MODELS, known_facts

from tests.planner_models import write_sparse_safetensors

GIB = 1 << 30


def test_every_public_model_reads_back_its_real_sizes_from_the_headers_alone(public_models: dict[str, Path]) -> None:
    for name, folder in public_models.items():
        # The folders are sparse: 100 GiB of weights on a few hundred KB of disk. Reading the data
        # would take minutes; reading every header takes milliseconds.
        on_disk = sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())
        apparent = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
        assert on_disk < 2 << 20 < apparent, name
        start = time.perf_counter()
        facts = read_folder(folder)
        assert time.perf_counter() - start < 1.0, name
        known = known_facts(name)
        assert known is not None
        assert [(c.name, c.class_name, c.parameters) for c in facts.components] == \
            [(c.name, c.class_name, c.parameters) for c in known.components], name
        assert (facts.pipeline, facts.cp_plan, facts.tp_plan, facts.heads) == \
            (known.pipeline, known.cp_plan, known.tp_plan, known.heads), name
        assert facts.source == f"the safetensors headers in {folder}"


@pytest.mark.parametrize(("name", "gib_bf16", "heads", "cp", "tp"), [
    # The public checkpoints' sizes at bfloat16, as their model cards and files say.
    ("stabilityai/stable-diffusion-xl-base-1.0", 6.5, None, False, False),
    ("black-forest-labs/FLUX.1-dev", 31.4, 24, True, True),
    ("black-forest-labs/FLUX.2-dev", 104.9, 48, True, True),
    ("Qwen/Qwen-Image", 53.7, 24, True, True),
    ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", 13.5, 12, True, False),
    ("Wan-AI/Wan2.1-T2V-14B-Diffusers", 37.4, 40, True, False),
])
def test_the_public_models_as_the_planner_sees_them(public_models: dict[str, Path], name: str, gib_bf16: float,
                                                    heads: int | None, cp: bool, tp: bool) -> None:
    facts = read_folder(public_models[name])
    assert round(facts.total_bytes("bfloat16") / GIB, 1) == gib_bf16
    assert facts.total_bytes("float32") == 2 * facts.total_bytes("bfloat16")
    assert (facts.heads, facts.cp_plan, facts.tp_plan) == (heads, cp, tp)


def test_a_stored_dtype_does_not_change_the_loaded_size(tmp_path: Path) -> None:
    """Floating tensors load at the job's dtype whatever they are stored in; others keep their size."""
    write_sparse_safetensors(tmp_path / "a.safetensors", {"w": ("F32", [1000, 10]), "scale": ("F8_E4M3", [64]),
                                                          "ids": ("I64", [8])})
    assert tensor_counts(read_header(tmp_path / "a.safetensors"), "a") == (10_000, 64 + 64)


def test_sharded_components_are_read_through_their_index_and_variants_are_left_out(tmp_path: Path) -> None:
    files = ["transformer/diffusion_pytorch_model.safetensors.index.json",
             "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
             "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
             "transformer/diffusion_pytorch_model.fp16.safetensors",
             "vae/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.fp16.safetensors"]
    index = {"weight_map": {"a": "diffusion_pytorch_model-00001-of-00002.safetensors",
                            "b": "diffusion_pytorch_model-00002-of-00002.safetensors"}}
    read = {"transformer/diffusion_pytorch_model.safetensors.index.json": index}.get
    assert weight_files(files, "transformer", read) == files[1:3]
    assert weight_files(files, "vae", read) == ["vae/diffusion_pytorch_model.safetensors"]
    assert weight_files(files, "vae", read, variant="fp16") == ["vae/diffusion_pytorch_model.fp16.safetensors"]


@pytest.mark.parametrize(("data", "said"), [
    (b"\x01", "shorter than a safetensors header"),
    (struct.pack("<Q", 10**12), "is not a safetensors header's"),
    (struct.pack("<Q", 4) + b"{no}", "not JSON"),
    (struct.pack("<Q", 40) + b"{}", "the header says 40 bytes"),
])
def test_a_file_that_is_no_safetensors_header_is_named(tmp_path: Path, data: bytes, said: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(FactsUnreadable, match=said) as e:
        read_header(path)
    assert str(path) in str(e.value)


def test_an_unknown_dtype_and_a_folder_without_an_index_are_named(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}).encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(FactsUnreadable, match="dtype 'Q4'"):
        tensor_counts(read_header(tmp_path / "x.safetensors"), "x.safetensors")
    with pytest.raises(FactsUnreadable, match=r"no model_index\.json"):
        read_folder(tmp_path)


def test_the_tiny_models_are_in_the_catalog_with_their_shapes() -> None:
    """The operator plans the built-in models from these figures (the runtime tests build the real ones:
    tests/runtime/test_runtime_planner.py reads them back)."""
    wan = known_facts("muralist/tiny-wan")
    assert wan is not None and (wan.heads, wan.cp_plan, wan.tp_plan) == (2, True, False)
    assert {name for name in KNOWN_MODELS if name.startswith("muralist/")} == {
        "muralist/tiny-flux", "muralist/tiny-shapes-flux", "muralist/tiny-wan", "muralist/tiny-wan-i2v"}
