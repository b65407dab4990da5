"""muralist/tiny-shapes-flux, the bundled trained model: it resolves by name to the folder in the
runtime package, its files are the ones the training script wrote, and it draws what prompts it
never saw rendered ask for (adherence read back from the pixels, model/shapes.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.model import bundled, call, loading, resolve, shapes

from tests.runtime.conftest import make_job

NAME = "muralist/tiny-shapes-flux"
STEPS = 8
# Every caption of the world once, each at a seed training never used.
PROMPTS = shapes.evaluation_prompts(len(shapes.all_attributes()))


def runtime() -> RuntimeSpec:
    job = (make_job().set("spec.model.name", NAME)
           .prompts(*({"text": text, "seed": seed} for text, seed in PROMPTS))
           .generation(steps=STEPS, height=shapes.SIZE, width=shapes.SIZE, imagesPerPrompt=1,
                       extraArgs={"max_sequence_length": bundled.SHAPES_TEXT_TOKENS}))
    return RuntimeSpec.model_validate({"name": "shapes", "spec": job.obj(), "outputDir": "/unused"})


def test_files_match_their_recorded_checksums() -> None:
    folder = bundled.bundled_model(NAME)
    assert bundled.checksum_mismatches(folder) == []
    weights = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    assert 0 < weights <= 25 * 2**20
    assert not list(folder.rglob("*.bin")), "safetensors only"


def test_name_resolves_to_the_package_folder_without_a_build(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("MURALIST_TINY_MODELS", str(tmp_path))
    source, revision = resolve.resolve_model(runtime())
    assert (source, revision) == (str(bundled.bundled_model(NAME)), None)
    assert not list(tmp_path.iterdir()), "nothing built or copied"


@pytest.fixture(scope="module")
def rendered() -> tuple[float, float]:
    """(adherence, seconds per image) of every caption at an unseen seed, rendered by the
    runtime's own load and call path on one thread."""
    import torch
    from muralist_runtime.work import rows

    torch.set_num_threads(1)
    spec = runtime()
    pipe = loading.load_pipeline(spec, *resolve.resolve_model(spec))
    assert pipe.transformer.config.num_attention_heads % 2 == 0, "Ulysses 2 and TP 2 divide the heads"
    source = rows.open_rows(spec)
    items = rows.items_of(source.rows(0, source.count()), spec.spec.generation)
    assert [item.seed for item in items] == [seed for _, seed in PROMPTS]
    start = time.perf_counter()
    outputs = call.render_checked(pipe, spec, items)
    per_image = (time.perf_counter() - start) / len(items)
    images = [np.asarray(output.image.convert("RGB")) for output, _ in outputs]
    score = shapes.adherence(zip([item.prompt for item in items], images, strict=True))
    print(f"adherence {score:.1%} of {len(items)} unseen seeds at {STEPS} steps; {per_image * 1000:.0f} ms per "
          "64x64 image on one thread")
    return score, per_image


def test_renders_a_64x64_image_well_under_a_second(rendered: tuple[float, float]) -> None:
    assert rendered[1] < 0.5


def test_renders_what_unseen_prompts_ask_for(rendered: tuple[float, float]) -> None:
    assert rendered[0] >= 0.9
