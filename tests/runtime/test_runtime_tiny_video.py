"""The tiny Wan pipelines and the tiny LoRA: deterministic, loadable, and doing what they claim."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from muralist_runtime.model.tiny import LORA_WEIGHT_NAME, TINY_BUILDERS, build_tiny, build_tiny_lora

WAN_NAMES = ["muralist/tiny-wan", "muralist/tiny-wan-i2v"]
VIDEO = {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2, "max_sequence_length": 16}


def weight_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.safetensors"))}


def generator() -> Any:  # a torch.Generator; torch is imported lazily, as in the runtime
    import torch

    return torch.Generator("cpu").manual_seed(0)


@pytest.fixture(scope="module")
def wan_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-wan")
    return {name: build_tiny(name, root / name.replace("/", "--")) for name in WAN_NAMES}


@pytest.mark.parametrize("name", WAN_NAMES)
def test_building_twice_gives_identical_weights(name: str, wan_dirs: dict[str, Path], tmp_path: Path) -> None:
    again = build_tiny(name, tmp_path / "again")
    assert weight_hashes(again) == weight_hashes(wan_dirs[name]) and len(weight_hashes(again)) == 3
    assert build_tiny(name, again) == again, "a complete directory is kept, not rebuilt"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging dir left"


def test_unknown_tiny_name_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="muralist/tiny-wan"):
        build_tiny("muralist/tiny-sdxl", tmp_path / "x")
    assert set(WAN_NAMES) | {"muralist/tiny-flux"} == set(TINY_BUILDERS)


def test_tiny_wan_reloads_and_renders_video(wan_dirs: dict[str, Path]) -> None:
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(wan_dirs["muralist/tiny-wan"], dtype=torch.float32)
    assert type(pipe).__name__ == "WanPipeline"
    transformer = pipe.transformer
    assert transformer._cp_plan is not None and transformer.config.num_attention_heads % 2 == 0
    tokens: list[int] = []
    hook = transformer.patch_embedding.register_forward_hook(
        lambda _m, _i, out: tokens.append(out.shape[2] * out.shape[3] * out.shape[4]))
    frames = pipe("a red fox", generator=generator(), **VIDEO).frames
    hook.remove()
    assert frames.shape == (1, 9, 32, 32, 3) and 0.0 <= frames.min() <= frames.max() <= 1.0
    # ((9 - 1) / 4 + 1) latent frames x (32 / 8 / 2)^2 patches: even, as Ulysses 2 needs.
    assert set(tokens) == {3 * 2 * 2}


def test_tiny_wan_i2v_renders_from_an_image(wan_dirs: dict[str, Path]) -> None:
    import torch
    from diffusers import DiffusionPipeline
    from PIL import Image

    pipe = DiffusionPipeline.from_pretrained(wan_dirs["muralist/tiny-wan-i2v"], dtype=torch.float32)
    assert type(pipe).__name__ == "WanImageToVideoPipeline" and pipe.image_encoder is None
    image = Image.new("RGB", (32, 32), (200, 40, 40))
    frames = pipe(image=image, prompt="a red fox", generator=generator(), output_type="pil", **VIDEO).frames[0]
    assert len(frames) == 9 and frames[0].size == (32, 32)


@pytest.fixture(scope="module")
def flux(tiny_model: Path) -> Any:
    import torch
    from diffusers import FluxPipeline

    return FluxPipeline.from_pretrained(tiny_model, dtype=torch.float32)


def render(pipe: Any) -> np.ndarray:
    out = pipe("a red fox", height=32, width=32, num_inference_steps=2, max_sequence_length=16,
               output_type="np", generator=generator())
    return out.images[0]


def test_tiny_lora_changes_the_image_and_scale_zero_restores_it(flux: Any, tiny_model: Path, tmp_path: Path) -> None:
    lora = build_tiny_lora(tiny_model, tmp_path / "lora")
    assert [p.name for p in lora.iterdir()] == [LORA_WEIGHT_NAME]
    assert weight_hashes(build_tiny_lora(tiny_model, tmp_path / "again")) == weight_hashes(lora)
    base = render(flux)
    flux.load_lora_weights(lora, adapter_name="tiny")
    try:
        with_lora = render(flux)
        assert np.abs(with_lora - base).max() > 0.1  # measured 0.198; a prompt change moves ~0.025
        flux.set_adapters(["tiny"], adapter_weights=[0.0])
        assert np.array_equal(render(flux), base)  # measured: exactly 0.0
        flux.set_adapters(["tiny"], adapter_weights=[1.0])
        flux.fuse_lora(adapter_names=["tiny"])
        assert np.abs(render(flux) - with_lora).max() < 1e-5  # measured 3.3e-7
        flux.unfuse_lora()
    finally:
        flux.unload_lora_weights()
    assert np.abs(render(flux) - base).max() < 1e-5


def test_lora_for_other_modules_is_refused_by_name(flux: Any, tiny_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    lora = build_tiny_lora(tiny_model, tmp_path / "lora")
    weights = load_file(lora / LORA_WEIGHT_NAME)
    (tmp_path / "other").mkdir()
    save_file({k.replace(".attn.", ".attn1."): v for k, v in weights.items()},
              tmp_path / "other" / LORA_WEIGHT_NAME, metadata={"format": "pt"})
    # peft's NoMatchingPeftModuleError, a ValueError: what the runtime turns into a permanent failure.
    with pytest.raises(ValueError, match=r"Target modules \{.*attn1.* not found in the base model"):
        flux.load_lora_weights(tmp_path / "other", adapter_name="other")
    assert flux.get_list_adapters() == {}
