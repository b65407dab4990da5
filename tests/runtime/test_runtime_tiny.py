"""The tiny pipeline: deterministic, small, loadable by the real from_pretrained."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_cli_builds_the_same_pipeline_every_time(tmp_path: Path, tiny_model: Path, runtime_env) -> None:
    proc = subprocess.run([sys.executable, "-m", "muralist_cli", "tiny-pipeline",
                           str(tmp_path / "again")], env=runtime_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    built = Path(proc.stdout.strip().splitlines()[-1])
    assert files(built) == files(tiny_model), "identical bytes: every rank builds the same weights"
    assert sum(len(b) for b in files(built).values()) < 2_000_000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging dir left"


def test_loads_with_from_pretrained(tiny_model: Path) -> None:
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_model, dtype=torch.float32)
    assert type(pipe).__name__ == "FluxPipeline"
    transformer = pipe.transformer
    assert transformer._cp_plan is not None and transformer._tp_plan is not None
    assert transformer.config.num_attention_heads == 2
    out = pipe("a red fox", height=16, width=16, num_inference_steps=1, max_sequence_length=8,
               generator=torch.Generator("cpu").manual_seed(0))
    assert out.images[0].size == (16, 16)


def test_vae_tiling_decodes_tile_by_tile(tiny_model: Path) -> None:
    import torch
    from diffusers import DiffusionPipeline
    from muralist_runtime.model.loading import enable_vae_tiling

    pipe = DiffusionPipeline.from_pretrained(tiny_model, dtype=torch.float32)
    assert enable_vae_tiling(pipe) and pipe.vae.use_tiling
    # Tiles smaller than the image, so the tiled path really runs.
    scale = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    pipe.vae.tile_sample_min_size, pipe.vae.tile_latent_min_size = 32, 32 // scale
    calls: list[tuple[int, ...]] = []
    original = pipe.vae.tiled_decode
    pipe.vae.tiled_decode = lambda z, **kw: calls.append(tuple(z.shape)) or original(z, **kw)
    out = pipe("a red fox", height=64, width=64, num_inference_steps=1, max_sequence_length=8,
               generator=torch.Generator("cpu").manual_seed(0))
    assert out.images[0].size == (64, 64) and calls
