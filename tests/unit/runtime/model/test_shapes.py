"""The shapes world and its adherence metric: the metric reads the generator's own images back
exactly, and fails images that do not show what the prompt names."""

from __future__ import annotations

import numpy as np
import pytest
from muralist_runtime.model import shapes


@pytest.fixture(scope="module")
def scenes() -> list[shapes.Scene]:
    return shapes.training_scenes(300, seed=7)


def test_captions_cover_every_combination_once() -> None:
    attributes = shapes.all_attributes()
    assert len(attributes) == len(shapes.PALETTE) * (len(shapes.PALETTE) - 1) * len(shapes.SHAPES)
    assert len({a.caption() for a in attributes}) == len(attributes)
    assert all(a.colour != a.background for a in attributes)
    assert all(shapes.parse_caption(a.caption()) == a for a in attributes)
    assert all(len(a.caption().split()) <= 8 for a in attributes), "the model reads 8 text tokens"
    assert all(set(a.caption().split()) <= set(shapes.VOCABULARY) for a in attributes)


def test_parse_caption_refuses_other_prompts() -> None:
    assert shapes.parse_caption("A Red Circle on a blue background") == shapes.Attributes("red", "circle", "blue")
    for prompt in ("a red fox in a snowy forest", "a purple circle on a blue background",
                   "a red hexagon on a blue background", "a red circle"):
        assert shapes.parse_caption(prompt) is None
        assert not shapes.adheres(prompt, shapes.draw(shapes.training_scenes(1, 0)[0]))


def test_generator_varies_size_and_position(scenes: list[shapes.Scene]) -> None:
    assert len({s.side for s in scenes}) > 10
    assert len({s.centre for s in scenes}) == len(scenes)
    assert len({s.attributes for s in scenes}) > 80
    image = shapes.draw(scenes[0])
    assert image.shape == (shapes.SIZE, shapes.SIZE, 3) and image.dtype == np.uint8


def test_metric_reads_the_generators_images_exactly(scenes: list[shapes.Scene]) -> None:
    pairs = [(s.attributes.caption(), shapes.draw(s)) for s in scenes]
    assert shapes.adherence(pairs) == 1.0


@pytest.mark.parametrize("field", ["colour", "shape", "background"])
def test_metric_fails_a_caption_that_differs_in_one_attribute(scenes: list[shapes.Scene], field: str) -> None:
    options = {"colour": list(shapes.PALETTE), "shape": list(shapes.SHAPES), "background": list(shapes.PALETTE)}
    pairs = []
    for scene in scenes[:60]:
        wanted = scene.attributes
        other = next(v for v in options[field] if v != getattr(wanted, field)
                     and v not in (wanted.colour, wanted.background))
        changed = shapes.Attributes(**{**wanted.__dict__, field: other})
        pairs.append((changed.caption(), shapes.draw(scene)))
    assert shapes.adherence(pairs) == 0.0


def test_metric_fails_blank_and_noise_images() -> None:
    caption = "a red circle on a blue background"
    blank = np.full((shapes.SIZE, shapes.SIZE, 3), shapes.PALETTE["blue"], dtype=np.uint8)
    noise = np.random.default_rng(0).integers(0, 256, (shapes.SIZE, shapes.SIZE, 3), dtype=np.uint8)
    assert shapes.read_back(blank) == shapes.Attributes(None, None, "blue")
    assert shapes.adherence([(caption, blank), (caption, noise)]) == 0.0


def test_metric_tolerates_blur_and_noise(scenes: list[shapes.Scene]) -> None:
    """A render is softer than a drawing: a 3x3 box blur and +-20 noise still read back right."""
    rng = np.random.default_rng(1)
    pairs = []
    for scene in scenes[:100]:
        image = shapes.draw(scene).astype(np.float64)
        padded = np.pad(image, ((1, 1), (1, 1), (0, 0)), mode="edge")
        blurred = sum(padded[dy:dy + shapes.SIZE, dx:dx + shapes.SIZE] for dy in range(3) for dx in range(3)) / 9
        noisy = np.clip(blurred + rng.uniform(-20, 20, blurred.shape), 0, 255).astype(np.uint8)
        pairs.append((scene.attributes.caption(), noisy))
    assert shapes.adherence(pairs) >= 0.98


def test_evaluation_prompts_cycle_captions_with_fresh_seeds() -> None:
    prompts = shapes.evaluation_prompts(180)
    assert len({p for p, _ in prompts}) == len(shapes.all_attributes())
    assert min(seed for _, seed in prompts) >= shapes.EVALUATION_SEED_START
    assert len({seed for _, seed in prompts}) == 180
