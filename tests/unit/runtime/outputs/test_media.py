"""Video encoding: round trips, exactness where promised, byte-for-byte determinism."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest
from muralist_runtime.outputs import media
from PIL import Image

FPS = 8


def smooth_frames(n: int = 9, height: int = 32, width: int = 32) -> np.ndarray:
    """Float frames in [0, 1] like diffusers' output_type="np": moving colour gradients."""
    t = np.arange(n)[:, None, None, None]
    y = np.arange(height)[None, :, None, None]
    x = np.arange(width)[None, None, :, None]
    c = np.arange(3)
    return ((np.sin((x + 3 * t) / 16 + c) + np.cos((y - 2 * t) / 16 + 2 * c)) / 4 + 0.5).astype(np.float32)


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return smooth_frames()


@pytest.fixture(scope="module")
def pixels(frames: np.ndarray) -> np.ndarray:
    return media.frames_to_uint8(frames)


@pytest.mark.parametrize("fmt", media.VIDEO_FORMATS)
def test_round_trip_keeps_frame_count_and_size(fmt: str, frames: np.ndarray) -> None:
    decoded = media.decode_video(media.encode_video(frames, FPS, fmt), fmt)
    assert decoded.shape == (9, 32, 32, 3) and decoded.dtype == np.uint8


def test_lossless_webp_is_exact(pixels: np.ndarray) -> None:
    assert np.array_equal(media.decode_video(media.encode_video(pixels, FPS, "webp"), "webp"), pixels)


# Measured on these frames (9 x 32x32, of 255): mp4 max abs diff 9, mean 2.0, nearly all of it
# from yuv420p's halved chroma (8 and 1.85 without x264); GIF (256-colour palette) 11, mean 1.9.
@pytest.mark.parametrize(("fmt", "max_diff", "mean_diff"), [("mp4", 12, 2.5), ("gif", 14, 2.5)])
def test_lossy_formats_stay_close(fmt: str, max_diff: int, mean_diff: float, pixels: np.ndarray) -> None:
    diff = np.abs(media.decode_video(media.encode_video(pixels, FPS, fmt), fmt).astype(int) - pixels)
    assert diff.max() <= max_diff and diff.mean() <= mean_diff, (diff.max(), diff.mean())


@pytest.mark.parametrize("fmt", media.VIDEO_FORMATS)
def test_same_frames_same_bytes_whatever_the_input_type(fmt: str, frames: np.ndarray, pixels: np.ndarray) -> None:
    as_pil = [Image.fromarray(p) for p in pixels]
    encoded = {media.encode_video(frames, FPS, fmt), media.encode_video(pixels, FPS, fmt),
               media.encode_video(as_pil, FPS, fmt)}
    assert len(encoded) == 1


def test_bytes_identical_in_another_process(frames: np.ndarray) -> None:
    # Another heap layout and hash seed: x264's mbtree made ~1% of encodes differ before it was
    # turned off (see media._X264_OPTIONS); a fresh process is where such leaks show.
    code = ("import hashlib, sys; from muralist_runtime.outputs import media;"
            "from tests.unit.runtime.outputs.test_media import smooth_frames;"
            "sys.stdout.write(hashlib.sha256(media.encode_video(smooth_frames(), 8, 'mp4')).hexdigest())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert other.stdout == hashlib.sha256(media.encode_video(frames, FPS, "mp4")).hexdigest()


def test_odd_size_mp4_names_the_size_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"even width and height, got 33x32: render at 34x32"):
        media.encode_video(smooth_frames(3, height=32, width=33), FPS, "mp4")
    assert media.decode_video(media.encode_video(smooth_frames(3, 32, 33), FPS, "webp"), "webp").shape == (3, 32, 33, 3)


@pytest.mark.parametrize("fmt", ["webp", "gif"])
def test_identical_frames_come_back_when_decoded_with_fps(fmt: str, pixels: np.ndarray) -> None:
    still = np.concatenate([pixels[:1]] * 3 + [pixels[1:3]])  # 3 identical frames, then 2 others
    data = media.encode_video(still, FPS, fmt)
    assert len(media.decode_video(data, fmt)) == 3, "stored once with a longer duration"
    assert len(media.decode_video(data, fmt, fps=FPS)) == 5


def test_info_poster_and_bad_input(frames: np.ndarray, pixels: np.ndarray) -> None:
    assert media.video_info("mp4") == {"codec": "h264", "pixelFormat": "yuv420p", "container": "mp4"}
    poster = media.poster_frame(frames)
    assert poster.size == (32, 32) and np.array_equal(np.asarray(poster), pixels[0])
    assert media.poster_frame([Image.fromarray(p) for p in pixels]).tobytes() == poster.tobytes()
    with pytest.raises(ValueError, match="unknown video format 'avi'"):
        media.encode_video(frames, FPS, "avi")
    with pytest.raises(ValueError, match=r"output.frames\[i\]"):
        media.encode_video(frames[None], FPS, "gif")
