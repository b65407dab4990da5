"""Pre-flight of ContextParallel layouts: sequence lengths from config files, torch-free."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from muralist_runtime.preflight import check_context_parallel
from muralist_runtime.spec.sequence import (
    UNEVEN_RING,
    UNEVEN_ULYSSES,
    cp_problems,
    patch_size,
    sequence_lengths,
    text_tokens,
    vae_scale_factor,
)

FLUX_VAE = {"_class_name": "AutoencoderKL", "block_out_channels": [128, 256, 512, 512]}
FLUX_TRANSFORMER = {"_class_name": "FluxTransformer2DModel", "patch_size": 1,
                    "num_attention_heads": 24}


def test_flux_1024_lengths() -> None:
    assert vae_scale_factor(FLUX_VAE) == 8
    assert patch_size(FLUX_TRANSFORMER) == 2, "Flux packs 2x2 latents; its config says 1"
    lengths = sequence_lengths(1024, 1024, 8, 2, 512)
    assert (lengths.latent_height, lengths.latent_width, lengths.image_tokens) == (64, 64, 4096)
    assert patch_size({"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2]}) == 2


def test_text_tokens_from_extra_args() -> None:
    assert text_tokens({}) == 512
    assert text_tokens({"max_sequence_length": 256}) == 256


def test_divisible_layout_passes() -> None:
    verdict = cp_problems(sequence_lengths(1024, 1024, 8, 2), heads=24, ring=1, ulysses=4)
    assert verdict.problems == [] and verdict.uneven == ""


def test_uneven_sequence_uses_diffusers_anything_modes() -> None:
    lengths = sequence_lengths(64, 64, 8, 2, 512)  # 4 x 4 = 16 tokens
    assert cp_problems(lengths, heads=24, ring=1, ulysses=3).uneven == UNEVEN_ULYSSES
    assert cp_problems(lengths, heads=24, ring=3, ulysses=1).uneven == UNEVEN_RING


def test_uneven_with_ring_and_ulysses_is_refused_with_the_field() -> None:
    verdict = cp_problems(sequence_lengths(64, 64, 8, 2, 512), heads=24, ring=3, ulysses=2,
                          side=16)
    field, message = verdict.problems[0]
    assert field == "spec.generation.height"
    assert message.startswith("image sequence 4 x 4 = 16 tokens is not divisible by ringDegree "
                              "x ulyssesDegree 6; use height and width multiples of 96")


def test_heads_must_divide_by_ulysses() -> None:
    verdict = cp_problems(sequence_lengths(1024, 1024, 8, 2), heads=24, ring=1, ulysses=5)
    assert verdict.problems[0][0] == "spec.parallelism.contextParallel.ulyssesDegree"
    assert "24 attention heads" in verdict.problems[0][1]


def test_reads_local_configs(tmp_path: Path) -> None:
    for sub, cfg in (("transformer", FLUX_TRANSFORMER), ("vae", FLUX_VAE)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps(cfg))
    ok = check_context_parallel(str(tmp_path), None, 1024, 1024, {}, 1, 2)
    assert ok.problems == [] and ok.uneven == ""
    bad = check_context_parallel(str(tmp_path), None, 1024, 1024, {}, 1, 5)
    assert [f for f, _ in bad.problems] == ["spec.parallelism.contextParallel.ulyssesDegree"]
    # No transformer (a UNet pipeline): nothing to check here, check_model refuses it later.
    assert check_context_parallel(str(tmp_path / "vae"), None, 64, 64, {}, 1, 2).problems == []


def test_preflight_and_the_spec_package_are_torch_free() -> None:
    # What the operator image imports must not need torch (import-linter checks the static
    # imports; this checks what really loads).
    code = ("import pkgutil, sys, importlib, muralist_runtime.spec as spec, muralist_runtime.preflight; "
            "[importlib.import_module(m.name) for m in pkgutil.iter_modules(spec.__path__, 'muralist_runtime.spec.')]; "
            "heavy = {'torch', 'diffusers', 'transformers'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("height", [32, 48])
def test_tiny_model_lengths(height: int) -> None:
    # The tiny pipeline: one VAE block (scale 1), Flux packing: 32 -> 16 tokens per side.
    lengths = sequence_lengths(height, 32, 1, 2, 16)
    assert lengths.image_tokens == (height // 2) * 16


def test_uneven_refused_without_gpus() -> None:
    lengths = sequence_lengths(64, 64, 8, 2, 512)
    verdict = cp_problems(lengths, heads=24, ring=1, ulysses=3, allow_uneven=False)
    assert verdict.uneven == "" and verdict.problems[0][0] == "spec.generation.height"
    assert verdict.problems[0][1].endswith("(uneven splits need GPUs)")
