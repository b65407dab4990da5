"""Video outputs: frames to mp4 / animated WebP / GIF bytes and back, as pure functions.

Kept free of torch (and of numpy, Pillow and PyAV until a function runs) so the writer and the
CLI can import it cheaply. Every encoder is made deterministic: the same frames give the same
bytes on every call and in every process, so reruns and retries of an item write identical
files (x264 runs single-threaded without mbtree, and the mp4 muxer writes no version tag).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

VIDEO_FORMATS = ("mp4", "webp", "gif")

# x264's constant-rate factor: 18 is close to visually lossless, and the default preset keeps
# encoding fast. mbtree off: with it, about 1 encode in 100 of the same 32x32 or 64x64 frames
# came out different (none in 400 without it), apparently uninitialised reads in its lookahead
# at small sizes; it only saves some bitrate. Threads are pinned to 1 below: x264's bitstream
# depends on the thread count, whose default follows the CPU count, which differs between nodes.
_X264_OPTIONS = {"crf": "18", "preset": "medium", "x264-params": "mbtree=0"}

_INFO = {
    "mp4": {"codec": "h264", "pixelFormat": "yuv420p", "container": "mp4"},
    "webp": {"codec": "webp-lossless", "pixelFormat": "rgb24", "container": "webp"},
    "gif": {"codec": "gif", "pixelFormat": "pal8", "container": "gif"},
}


def _check_format(fmt: str) -> str:
    if fmt not in VIDEO_FORMATS:
        raise ValueError(f"unknown video format {fmt!r}; expected one of {', '.join(VIDEO_FORMATS)}")
    return fmt


def frames_to_uint8(frames: Any) -> np.ndarray:
    """(T, H, W, 3) uint8 from PIL images, or arrays of uint8 or of floats in [0, 1].

    Floats are scaled like diffusers' numpy_to_pil ((x * 255).round()), so output_type="np"
    and output_type="pil" of the same render give the same pixels.
    """
    import numpy as np
    from PIL import Image

    if isinstance(frames, np.ndarray):
        array = frames
    else:
        frames = list(frames)
        if not frames:
            raise ValueError("a video needs at least one frame")
        if all(isinstance(f, Image.Image) for f in frames):
            array = np.stack([np.asarray(f.convert("RGB")) for f in frames])
        else:
            array = np.stack([np.asarray(f) for f in frames])
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"video frames must be (frames, height, width, 3), got shape {tuple(array.shape)}"
                         " (a pipeline's output.frames is batched: pass output.frames[i])")
    if len(array) == 0:
        raise ValueError("a video needs at least one frame")
    if array.dtype == np.uint8:
        contiguous: np.ndarray = np.ascontiguousarray(array)
        return contiguous
    if np.issubdtype(array.dtype, np.floating):
        scaled: np.ndarray = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
        return scaled
    raise ValueError(f"video frames must be uint8 or float in [0, 1], got {array.dtype}")


def _frame_ms(fps: int) -> int:
    return max(1, round(1000 / fps))


def _encode_mp4(array: np.ndarray, fps: int) -> bytes:
    import av

    _, height, width, _ = array.shape
    if height % 2 or width % 2:
        raise ValueError(
            f"mp4 (H.264, yuv420p) needs an even width and height, got {width}x{height}: render at "
            f"{width + width % 2}x{height + height % 2} (or crop/pad the frames), or use webp or gif"
        )
    buffer = io.BytesIO()
    # bitexact: the muxer writes no "Lavf" version tag (x264 still records its own version).
    with av.open(buffer, mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("libx264", rate=fps, options=_X264_OPTIONS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.thread_count = 1
        for index, pixels in enumerate(array):
            # swscale's default RGB -> YUV: BT.601 limited range, what decoders assume untagged.
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuv420p")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))  # flush the frames x264 still holds (lookahead, B-frames)
    return buffer.getvalue()


def _encode_pillow(array: np.ndarray, fps: int, fmt: str) -> bytes:
    from PIL import Image

    images = [Image.fromarray(pixels, "RGB") for pixels in array]
    buffer = io.BytesIO()
    options: dict[str, Any] = {"lossless": True, "quality": 100, "method": 4} if fmt == "webp" else {}
    # loop=0: repeat forever, as a gallery preview should. GIF stores durations in 1/100 s, so
    # fps that do not divide 100 play slightly off (24 fps -> 40 ms frames).
    images[0].save(buffer, format=fmt.upper(), save_all=True, append_images=images[1:],
                   duration=_frame_ms(fps), loop=0, **options)
    return buffer.getvalue()


def encode_video(frames: Sequence[Image.Image] | np.ndarray, fps: int, fmt: str) -> bytes:
    """Encode frames (PIL images, or a (T, H, W, 3) uint8 or [0, 1] float array) as `fmt` bytes.

    mp4: H.264 yuv420p (lossy, even sizes only); webp: lossless animated WebP; gif: 256-colour
    GIF. Both animations loop forever. Note that WebP and GIF store a run of identical
    consecutive frames once, with a longer duration: decode with `fps` to get them all back.
    """
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    array = frames_to_uint8(frames)
    if _check_format(fmt) == "mp4":
        return _encode_mp4(array, fps)
    return _encode_pillow(array, fps, fmt)


def decode_video(data: bytes, fmt: str, fps: float | None = None) -> np.ndarray:
    """The frames of an encoded video as a (T, H, W, 3) uint8 array.

    mp4 is read with PyAV; WebP and GIF with Pillow (PyAV cannot decode animated WebP). With
    `fps`, a WebP/GIF frame that the encoder stored once for a run of identical frames is
    repeated to its duration, so the frame count is the encoded one.
    """
    import numpy as np

    if _check_format(fmt) == "mp4":
        import av

        with av.open(io.BytesIO(data), mode="r", format="mp4") as container:
            decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        video: np.ndarray = np.stack(decoded)
        return video

    from PIL import Image, ImageSequence

    out: list[np.ndarray] = []
    with Image.open(io.BytesIO(data)) as image:
        for frame in ImageSequence.Iterator(image):
            pixels = np.asarray(frame.convert("RGB"))  # convert() loads the frame, and its duration
            repeat = 1
            if fps is not None and frame.info.get("duration"):
                repeat = max(1, round(frame.info["duration"] * fps / 1000))
            out += [pixels] * repeat
    frames: np.ndarray = np.stack(out)
    return frames


def video_info(fmt: str) -> dict[str, str]:
    """What the per-item JSON records about a video file of format `fmt`."""
    return dict(_INFO[_check_format(fmt)])


def poster_frame(frames: Sequence[Image.Image] | np.ndarray) -> Image.Image:
    """The first frame as an RGB PIL image: the still a gallery shows for a video."""
    from PIL import Image

    return Image.fromarray(frames_to_uint8(frames[:1])[0], "RGB")
