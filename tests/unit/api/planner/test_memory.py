"""The memory estimate, each part checked by hand against the formula docs/concepts/strategies.md gives."""

from __future__ import annotations

import pytest
from muralist_api.planner.known import known_facts
from muralist_api.planner.memory import Workload, activations, estimate, sequence, usable, vae_decode

FLUX = known_facts("black-forest-labs/FLUX.1-dev")
WAN14 = known_facts("Wan-AI/Wan2.1-T2V-14B-Diffusers")
SDXL = known_facts("stabilityai/stable-diffusion-xl-base-1.0")
assert FLUX is not None and WAN14 is not None and SDXL is not None


def test_tokens_from_height_width_frames_and_patching() -> None:
    flux = sequence(FLUX, Workload(1024, 1024))
    # VAE /8, Flux packs 2x2 latents: 64 x 64 image tokens, plus 512 text tokens (joint attention).
    assert flux is not None and (flux.lengths.image_tokens, flux.tokens, flux.side) == (4096, 4608, 16)
    wan = sequence(WAN14, Workload(480, 832, 81))
    # 81 frames -> 21 latent frames; 480/16 x 832/16 = 30 x 52; Wan attends to the text apart.
    assert wan is not None and (wan.lengths.image_tokens, wan.tokens, wan.frames) == (21 * 30 * 52, 32_760, 81)
    default = sequence(WAN14, Workload(480, 832))
    assert default is not None and default.frames == 81  # the pipeline's default numFrames


def test_activations_per_device_and_how_each_split_divides_them() -> None:
    work = Workload(1024, 1024)
    hidden, ffn, tokens = 24 * 128, 4 * 24 * 128, 4608
    assert activations(FLUX, work) == tokens * (6 * hidden + 2 * ffn) * 2  # bfloat16
    # Context parallel: a rank holds its share of the tokens.
    assert activations(FLUX, work, split_sequence=4) == int(tokens / 4 * (6 * hidden + 2 * ffn) * 2)
    # Tensor parallel: the heads and the feed-forward are split, the residual stream is not.
    assert activations(FLUX, work, split_tensors=2) == int(tokens * (2 * hidden + (4 * hidden + 2 * ffn) / 2) * 2)
    # A backend that is not fused holds the scores (heads x tokens x tokens, twice).
    unfused = activations(FLUX, Workload(1024, 1024, fused_attention=False))
    assert unfused - activations(FLUX, work) == 2 * 24 * tokens * tokens * 2
    # SDXL batches the unconditional prediction with the conditional one.
    assert activations(SDXL, Workload(1024, 1024)) == 2 * activations(SDXL, Workload(1024, 1024, batch=1)) // 2
    assert activations(SDXL, Workload(1024, 1024, batch=2)) == 2 * activations(SDXL, Workload(1024, 1024))


def test_the_vae_decode_and_what_tiling_saves() -> None:
    work = Workload(2048, 2048)
    # The decoder's first width (128) at full resolution x 10, plus the image itself (3 channels), bf16.
    assert vae_decode(FLUX, work) == (2048 * 2048 * 128 * 10 + 3 * 2048 * 2048) * 2
    tiled = vae_decode(FLUX, Workload(2048, 2048, vae_tiling=True))
    assert tiled == (1024 * 1024 * 128 * 10 + 3 * 2048 * 2048) * 2  # one 1024-pixel tile at a time
    video = vae_decode(WAN14, Workload(480, 832, 81))
    # Wan decodes one latent frame (4 frames) at a time, and holds the whole clip.
    assert video == (480 * 832 * 96 * 10 * 4 + 81 * 3 * 480 * 832) * 2
    # Tiled: one 256-pixel tile of 4 frames at a time, the clip itself still whole.
    assert vae_decode(WAN14, Workload(480, 832, 81, vae_tiling=True)) == \
        (256 * 256 * 96 * 10 * 4 + 81 * 3 * 480 * 832) * 2


def test_the_peak_is_the_weights_and_the_larger_of_activations_and_decode() -> None:
    est = estimate(FLUX, Workload(1024, 1024), FLUX.total_bytes("bfloat16"))
    assert est.peak == est.weights + max(est.activations, est.vae_decode)
    assert est.weights == sum(c.parameters for c in FLUX.components) * 2
    assert estimate(FLUX, Workload(1024, 1024), 0, denoiser_here=False, vae_here=False).peak == 0


@pytest.mark.parametrize(("memory", "room"), [(80 << 30, int(0.9 * (80 << 30))), (0, 0)])
def test_a_tenth_of_each_device_is_kept_for_the_context_and_allocator(memory: int, room: int) -> None:
    assert usable(memory) == room
