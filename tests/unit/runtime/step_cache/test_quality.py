"""PSNR and SSIM (step_cache/quality.py) on images whose answer is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from muralist_runtime.step_cache import quality


def _noisy(level: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A mid-grey image and the same with +-level added to every value (random signs): MSE = level^2."""
    rng = np.random.default_rng(seed)
    image = np.full((48, 40, 3), 128, dtype=np.int16)
    return image, image + level * rng.choice([-1, 1], size=image.shape)


def test_identical_images_have_infinite_psnr_and_ssim_one() -> None:
    image = np.random.default_rng(1).integers(0, 256, (32, 32, 3))
    assert quality.psnr(image, image) == math.inf
    assert quality.ssim(image, image) == 1.0


@pytest.mark.parametrize("level", [1, 8, 32])
def test_psnr_of_known_noise(level: int) -> None:
    reference, noisy = _noisy(level)
    assert quality.psnr(reference, noisy) == pytest.approx(20 * math.log10(255 / level), abs=1e-9)


def test_ssim_of_flat_images_is_the_luminance_term() -> None:
    # No variance anywhere: SSIM reduces to (2 mu_x mu_y + C1) / (mu_x^2 + mu_y^2 + C1).
    a, b = np.full((16, 16, 3), 100.0), np.full((16, 16, 3), 140.0)
    c1 = (quality.K1 * 255) ** 2
    assert quality.ssim(a, b) == pytest.approx((2 * 100 * 140 + c1) / (100**2 + 140**2 + c1), rel=1e-9)


def test_ssim_falls_with_the_noise_and_stays_in_range() -> None:
    scores = [quality.ssim(*_noisy(level)) for level in (2, 8, 32, 96)]
    assert all(-1 <= s < 1 for s in scores)
    assert scores == sorted(scores, reverse=True)


def test_ssim_reads_structure_psnr_misses() -> None:
    # The same MSE two ways: a uniform brightness shift keeps the structure, noise destroys it.
    rng = np.random.default_rng(2)
    image = rng.integers(60, 190, (40, 40, 3)).astype(np.int16)
    shifted = image + 16
    noisy = image + 16 * rng.choice([-1, 1], size=image.shape)
    assert quality.psnr(image, shifted) == pytest.approx(quality.psnr(image, noisy))
    assert quality.ssim(image, shifted) > 0.95 > quality.ssim(image, noisy)


def test_videos_are_compared_frame_by_frame_and_small_images_get_a_smaller_window() -> None:
    frames = np.random.default_rng(3).integers(0, 256, (3, 8, 8, 3))
    assert quality.ssim(frames, frames) == 1.0
    assert quality.psnr(frames, frames[::-1].copy()) < 20


def test_shapes_must_match() -> None:
    with pytest.raises(ValueError, match="shapes"):
        quality.psnr(np.zeros((4, 4, 3)), np.zeros((4, 5, 3)))
