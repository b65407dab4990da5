"""Pre-flight of ContextParallel layouts: sequence lengths from config files, torch-free."""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from muralist_api.job import Generation
from muralist_api.rules.sequence import (
    UNEVEN_RING,
    UNEVEN_ULYSSES,
    cp_problems,
    patch_size,
    sequence_lengths,
    temporal_patch,
    text_tokens,
    token_frames,
    vae_scale_factor,
    vae_scales,
)
from muralist_runtime.model.preflight import check_context_parallel, cp_split_inputs

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


def model_dir(root: Path, transformer: dict, vae: dict, pipeline: str | None = None) -> Path:
    for sub, cfg in (("transformer", transformer), ("vae", vae)):
        (root / sub).mkdir(parents=True)
        (root / sub / "config.json").write_text(json.dumps(cfg))
    if pipeline:
        (root / "model_index.json").write_text(json.dumps({"_class_name": pipeline}))
    return root


def gen(height: int = 1024, width: int = 1024, **fields) -> Generation:
    return Generation(height=height, width=width, **fields)


def test_reads_local_configs(tmp_path: Path) -> None:
    model_dir(tmp_path, FLUX_TRANSFORMER, FLUX_VAE)
    ok = check_context_parallel(str(tmp_path), None, gen(), None, 1, 2)
    assert ok.problems == [] and ok.uneven == ""
    bad = check_context_parallel(str(tmp_path), None, gen(), None, 1, 5)
    assert [f for f, _ in bad.problems] == ["spec.parallelism.contextParallel.ulyssesDegree"]
    # No transformer (a UNet pipeline): nothing to check here, check_model refuses it later.
    assert check_context_parallel(str(tmp_path / "vae"), None, gen(64, 64), None, 1, 2).problems == []


# Wan 2.1's configs as the hub has them (heads 12 here, so that degree 3 divides them).
WAN_VAE = {"_class_name": "AutoencoderKLWan", "temperal_downsample": [False, True, True], "z_dim": 16}
WAN_TRANSFORMER = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 12}


def test_wan_video_lengths() -> None:
    assert vae_scales(WAN_VAE) == (8, 4)
    assert vae_scales({**WAN_VAE, "scale_factor_spatial": 16}) == (16, 4), "Wan 2.2's VAE says so itself"
    assert vae_scales(FLUX_VAE) == (8, 1)
    assert vae_scales({"_class_name": "AutoencoderKLLTXVideo", "patch_size": 4, "patch_size_t": 1,
                       "spatio_temporal_scaling": [True, True, True, False]}) == (32, 8)
    assert temporal_patch(WAN_TRANSFORMER) == 1 and patch_size(WAN_TRANSFORMER) == 2
    # 81 frames at 480 x 832: ((81 - 1) / 4 + 1) x (480 / 16) x (832 / 16) tokens.
    lengths = sequence_lengths(480, 832, 8, 2, frames=token_frames(81, 4))
    assert (lengths.latent_frames, lengths.latent_height, lengths.latent_width) == (21, 30, 52)
    assert lengths.image_tokens == 32_760
    assert token_frames(9, 4) == 3 and token_frames(17, 8, 1) == 3


def test_cp_plans_say_which_sequences_are_split() -> None:
    # Read from diffusers' classes: Flux splits the text tokens too, Wan only the video tokens.
    assert {"hidden_states", "encoder_hidden_states"} <= cp_split_inputs("FluxTransformer2DModel")
    wan = cp_split_inputs("WanTransformer3DModel")
    assert "hidden_states" in wan and "encoder_hidden_states" not in wan
    assert "encoder_hidden_states" in cp_split_inputs("LTXVideoTransformer3DModel")
    assert cp_split_inputs("UNet2DConditionModel") is None and cp_split_inputs("NoSuchModel") is None


def test_video_sequence_counts_frames_and_not_the_text(tmp_path: Path) -> None:
    root = model_dir(tmp_path, WAN_TRANSFORMER, WAN_VAE, "WanPipeline")
    # 16 x 16 pixels = 1 token per frame. numFrames unset: WanPipeline's default, 81 frames = 21.
    default = check_context_parallel(str(root), None, gen(16, 16), None, 1, 2, allow_uneven=False)
    assert default.problems[0][0] == "spec.generation.height"
    assert default.problems[0][1].startswith("video sequence 21 x 1 x 1 = 21 tokens is not divisible by ringDegree "
                                             "x ulyssesDegree 2; use height and width multiples of 32 (or another "
                                             "numFrames)")
    # 5 frames = 2 token frames: even. A text length of 15 is not, but Wan's plan does not split the text.
    five = gen(16, 16, num_frames=5, extra_args={"max_sequence_length": 15})
    assert check_context_parallel(str(root), None, five, None, 1, 2, allow_uneven=False).problems == []
    flux = model_dir(tmp_path / "flux", FLUX_TRANSFORMER, FLUX_VAE, "FluxPipeline")
    text = check_context_parallel(str(flux), None, gen(extra_args={"max_sequence_length": 15}), None, 1, 2,
                                  allow_uneven=False)
    assert [f for f, _ in text.problems] == ["spec.generation.extraArgs.max_sequence_length"]


def test_preflight_and_the_spec_package_are_torch_free() -> None:
    # What the operator image imports must not need torch (import-linter checks the static
    # imports; this checks what really loads).
    code = ("import pkgutil, sys, importlib, muralist_api as spec, muralist_runtime.model.preflight; "
            "[importlib.import_module(m.name) for m in pkgutil.iter_modules(spec.__path__, 'muralist_api.')]; "
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


# -- a pre-flight that cannot read its configs says so, once ---------------------------------------

SKIPPED = "context-parallel pre-flight skipped for model"


def preflight_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_config_the_model_lacks_is_quiet_one_that_cannot_be_read_is_said(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="muralist")
    root = model_dir(tmp_path, FLUX_TRANSFORMER, FLUX_VAE)
    (root / "vae" / "config.json").unlink()  # absent: nothing to check, and nothing wrong
    assert check_context_parallel(str(root), None, gen(), None, 1, 5).problems == []
    assert preflight_warnings(caplog) == []
    (root / "vae" / "config.json").write_text('{"_class_name": "AutoencoderKL", ')  # cut short
    assert check_context_parallel(str(root), None, gen(), None, 1, 5).problems == []
    [warning] = preflight_warnings(caplog)
    assert warning.startswith(f"{SKIPPED} {str(root)!r}: cannot read vae/config.json: JSONDecodeError: ")


@pytest.fixture(scope="module")
def hub_stand_in() -> Iterator[str]:
    """A loopback stand-in for the hub's file API: org/gated refuses without a token (the hub's
    401 GatedRepo), any other repo has no such file (404 EntryNotFound)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            gated = self.path.startswith("/org/gated/")
            self.send_response(401 if gated else 404)
            self.send_header("X-Error-Code", "GatedRepo" if gated else "EntryNotFound")
            self.send_header("X-Error-Message", "Access to model org/gated is restricted." if gated
                             else "Entry not found")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def preflight_log(models: list[str], env: dict[str, str]) -> list[str]:
    """What check_context_parallel logs at WARNING for each model, in a process of its own (the
    hub client reads its endpoint and offline mode when imported)."""
    code = ("import logging, sys; logging.basicConfig(level=logging.WARNING, format='%(message)s'); "
            "from muralist_runtime.model.preflight import check_context_parallel; "
            "from muralist_api.job import Generation; "
            "[check_context_parallel(m, None, Generation(height=64, width=64), None, 1, 2) for m in sys.argv[1:]]")
    done = subprocess.run([sys.executable, "-c", code, *models], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stderr.splitlines() if "pre-flight" in line]


def test_a_hub_config_that_cannot_be_read_skips_the_preflight_and_names_the_model(tmp_path: Path,
                                                                                 hub_stand_in: str) -> None:
    hub = {"HF_ENDPOINT": hub_stand_in, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""}
    [gated] = preflight_log(["org/gated", "org/no-transformer"], hub)
    assert gated.startswith(f"{SKIPPED} 'org/gated': cannot read transformer/config.json: GatedRepoError: "), gated
    assert "Access to model org/gated is restricted." in gated
    [offline] = preflight_log(["org/unreachable"], {**hub, "HF_HUB_OFFLINE": "1"})
    assert offline.startswith(f"{SKIPPED} 'org/unreachable': cannot read transformer/config.json: "), offline
