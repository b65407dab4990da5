"""Input images of image-conditioned items: paths on the inputs volume or bytes, each failure
a reason that names the field and the path."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.model.inputs import InputError, load_inputs, missing_inline_inputs
from muralist_runtime.outputs.thumbnails import thumbnail_jpeg
from PIL import Image


def runtime(inputs: Path | None) -> RuntimeSpec:
    return RuntimeSpec.model_validate({
        "name": "i", "outputDir": "/unused", "inputsDir": str(inputs) if inputs else None,
        "spec": {"model": {"name": "muralist/tiny-flux", "pipeline": "FluxInpaintPipeline"},
                 "inputs": {"volume": {"hostPath": {"path": "/in"}}},
                 "prompts": [{"text": "a", "image": "a.png", "mask": "sub/m.png"}, "b"]},
    })


def item(**inputs) -> Item:
    return Item(row=0, image_index=0, prompt="p", seed=0, **inputs)


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    Image.new("RGBA", (20, 10), (1, 2, 3, 4)).save(tmp_path / "a.png")
    (tmp_path / "sub").mkdir()
    Image.new("RGB", (20, 10), (255, 255, 255)).save(tmp_path / "sub" / "m.png")
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    return tmp_path


def test_images_load_as_rgb_and_masks_as_grey(volume: Path) -> None:
    loaded = load_inputs(runtime(volume), item(image="a.png", mask="sub/m.png"))
    assert (loaded["image"].mode, loaded["image"].size, loaded["mask"].mode) == ("RGB", (20, 10), "L")
    assert load_inputs(runtime(volume), item()) == {}


def test_bytes_from_a_data_set_column(volume: Path) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (3, 5), (9, 9, 9)).save(buf, format="JPEG")
    assert load_inputs(runtime(None), item(image=buf.getvalue()))["image"].size == (3, 5)
    with pytest.raises(InputError, match=r"^mask \(4 bytes from the data set\) is not a readable image"):
        load_inputs(runtime(None), item(mask=b"nope"))


@pytest.mark.parametrize(("value", "message"), [
    ("photos/x.png", "image 'photos/x.png' not found in spec.inputs.volume"),
    ("sub", "image 'sub' is a directory in spec.inputs.volume, not an image"),
    ("bad.png", "image 'bad.png' is not a readable image"),
    ("../etc/passwd", "image '../etc/passwd' is not a relative path inside spec.inputs.volume"),
    ("https://example.com/a.png", "image 'https://example.com/a.png' is a URL; inputs are read from "
                                  "spec.inputs.volume only"),
])
def test_each_problem_names_the_field_and_the_path(volume: Path, value: str, message: str) -> None:
    with pytest.raises(InputError) as e:
        load_inputs(runtime(volume), item(image=value))
    assert str(e.value).startswith(message), str(e.value)
    assert "Traceback" not in str(e.value) and "0x" not in str(e.value), "no object addresses: same on every rank"


def test_no_inputs_volume_mounted() -> None:
    with pytest.raises(InputError, match=r"no spec\.inputs\.volume is mounted"):
        load_inputs(runtime(None), item(image="a.png"))


def test_inline_prompts_checked_before_loading(volume: Path) -> None:
    assert missing_inline_inputs(runtime(volume)) == []
    (volume / "sub" / "m.png").unlink()
    assert missing_inline_inputs(runtime(volume)) == [
        f"spec.prompts[0].mask: 'sub/m.png' not found in spec.inputs.volume ({volume})"]


def test_thumbnails_are_small_deterministic_jpegs() -> None:
    big = Image.new("RGB", (1024, 512), (10, 200, 30))
    data = thumbnail_jpeg(big)
    assert data == thumbnail_jpeg(big) and big.size == (1024, 512), "the input is not changed"
    assert Image.open(io.BytesIO(data)).size == (256, 128)
