"""How far one render is from another of the same item: PSNR and SSIM on 8-bit pixels.

Pure numpy, so the runtime's cache gate (gate.py), the cache benchmark and the
tests compute them alike.

- PSNR: 10 log10(255^2 / MSE) over every pixel and channel; identical images give infinity.
- SSIM (Wang, Bovik, Sheikh and Simoncelli, 2004): on luminance (ITU-R BT.601 weights), with an
  11-tap Gaussian window of sigma 1.5 applied separably over the valid region (no padding),
  K1 = 0.01, K2 = 0.03, data range 255; the mean of the SSIM map. Identical images give exactly
  1.0. A video (frames, height, width, 3) gives the mean over its frames. Images smaller than
  the window use a window as large as they allow (odd, at least 3 pixels).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DATA_RANGE = 255.0
WINDOW = 11
SIGMA = 1.5
K1, K2 = 0.01, 0.03
LUMA = np.array([0.299, 0.587, 0.114])


def psnr(reference: Any, image: Any) -> float:
    """Peak signal-to-noise ratio in dB of `image` against `reference` (same shape, 8-bit levels)."""
    a, b = _pair(reference, image)
    mse = float(np.mean((a - b) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(DATA_RANGE**2 / mse)


def ssim(reference: Any, image: Any) -> float:
    """Mean structural similarity of `image` against `reference` on luminance (module docstring)."""
    a, b = _pair(reference, image)
    if a.ndim == 4:  # a video: frame by frame
        return float(np.mean([ssim(x, y) for x, y in zip(a, b, strict=True)]))
    x, y = _luminance(a), _luminance(b)
    window = _gaussian(min(WINDOW, _odd_at_most(min(x.shape))))
    mu_x, mu_y = _filter(x, window), _filter(y, window)
    var_x = _filter(x * x, window) - mu_x**2
    var_y = _filter(y * y, window) - mu_y**2
    cov = _filter(x * y, window) - mu_x * mu_y
    c1, c2 = (K1 * DATA_RANGE) ** 2, (K2 * DATA_RANGE) ** 2
    score = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return float(score.mean())


def _pair(reference: Any, image: Any) -> tuple[Any, Any]:
    a, b = np.asarray(reference, dtype=np.float64), np.asarray(image, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare images of shapes {a.shape} and {b.shape}")
    return a, b


def _luminance(pixels: Any) -> Any:
    return pixels[..., :3] @ LUMA if pixels.ndim == 3 else pixels


def _odd_at_most(size: int) -> int:
    return max(3, size if size % 2 else size - 1)


def _gaussian(size: int) -> Any:
    x = np.arange(size) - (size - 1) / 2
    weights = np.exp(-(x**2) / (2 * SIGMA**2))
    return weights / weights.sum()


def _filter(plane: Any, window: Any) -> Any:
    """The plane filtered by the window along both axes, valid region only."""
    from numpy.lib.stride_tricks import sliding_window_view

    rows = sliding_window_view(plane, len(window), axis=0) @ window
    return sliding_window_view(rows, len(window), axis=1) @ window
