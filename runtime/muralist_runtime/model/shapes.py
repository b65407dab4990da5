"""Coloured shapes on coloured backgrounds: the world `muralist/tiny-shapes-flux` was trained on.

Three things live here, all pure (numpy only), so that the training script, the tests and
anyone checking a render agree on them:

- the captioned training images: one circle, square or triangle of one palette colour on a
  background of another, at a random size and a position near the centre;
- prompts with seeds for evaluation, drawn from a seed range the training never used;
- prompt adherence by pixel statistics: the background, the shape's colour and the shape's kind
  read back from an image, and a strict score (every attribute the prompt names must match).

The read-back knows nothing of the model: border pixels give the background (nearest palette
colour), pixels far from it give the shape (its colour by nearest palette colour, its kind by
how much of its bounding box it fills: a square ~1, a circle ~pi/4, a triangle ~1/2).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

SIZE = 64  # pixels, square images
# Saturated, far apart in RGB (nearest pair: green-black, ~140), so nearest-colour reading is
# unambiguous even on a blurred render.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 25, 25),
    "green": (20, 160, 40),
    "blue": (25, 60, 230),
    "yellow": (245, 220, 30),
    "white": (240, 240, 240),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle")
# Every word a caption can use: the tokenizer's vocabulary.
VOCABULARY = ("a", "an", "on", "background", *PALETTE, *SHAPES)

# Geometry of the training images: bounding-box side and how far the centre may move. The box
# stays >= 6 px from the border, which the read-back samples for the background.
MIN_SIDE, MAX_SIDE = 24, 40
MAX_OFFSET = 6
BORDER = 3  # pixels of frame read for the background
# A pixel belongs to the shape when it is this far (RGB distance) from the background: about
# half the distance between the two closest palette colours.
SHAPE_DISTANCE = 70.0
MIN_SHAPE_PIXELS = 100  # smaller than any training shape (a 24 px triangle has ~290)
# Fill ratio of the bounding box: square 1, circle pi/4 = 0.785, triangle 0.5; cut halfway.
SQUARE_ABOVE, CIRCLE_ABOVE = 0.89, 0.64
# Evaluation seeds start here; training draws its scenes and noise from its own seeded
# generators and never uses these as pipeline seeds.
EVALUATION_SEED_START = 1_000_000

_CAPTION = re.compile(r"^\s*an? (\w+) (\w+) on an? (\w+) background\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Attributes:
    """What a caption names (and what an image is read back as; None where nothing was read)."""

    colour: str | None
    shape: str | None
    background: str | None

    def caption(self) -> str:
        colour, background = self.colour or "", self.background or ""
        return f"{_article(colour)} {colour} {self.shape} on {_article(background)} {background} background"


@dataclass(frozen=True)
class Scene:
    """One training image: its attributes and where the shape is (box side, centre)."""

    attributes: Attributes
    side: int
    centre: tuple[float, float]  # (x, y) in pixels


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def all_attributes() -> list[Attributes]:
    """Every caption the world has: a shape of one colour on a background of another (90)."""
    return [Attributes(colour, shape, background)
            for background, colour, shape in product(PALETTE, PALETTE, SHAPES) if colour != background]


def parse_caption(text: str) -> Attributes | None:
    """The attributes a prompt names, or None when it is not a caption of this world."""
    match = _CAPTION.match(text)
    if match is None:
        return None
    colour, shape, background = (w.lower() for w in match.groups())
    if colour not in PALETTE or background not in PALETTE or shape not in SHAPES:
        return None
    return Attributes(colour, shape, background)


def random_scene(rng: np.random.Generator) -> Scene:
    """A uniformly drawn caption at a random size and position."""
    attributes = all_attributes()[int(rng.integers(len(all_attributes())))]
    side = int(rng.integers(MIN_SIDE, MAX_SIDE + 1))
    cx, cy = SIZE / 2 + rng.uniform(-MAX_OFFSET, MAX_OFFSET, size=2)
    return Scene(attributes, side, (float(cx), float(cy)))


def _inside(shape: str, x: Any, y: Any, side: float, centre: tuple[float, float]) -> Any:
    """Boolean mask of points (x, y) inside the shape."""
    cx, cy = centre
    half = side / 2
    if shape == "circle":
        return (x - cx) ** 2 + (y - cy) ** 2 <= half**2
    if shape == "square":
        return (np.abs(x - cx) <= half) & (np.abs(y - cy) <= half)
    if shape == "triangle":  # apex up, base at the bottom of the box, as wide as it is tall
        top = cy - half
        return (y <= cy + half) & (y >= top) & (np.abs(x - cx) <= (y - top) / 2)
    raise ValueError(f"unknown shape {shape!r}")


def draw(scene: Scene, supersample: int = 4) -> Any:
    """The scene as uint8 RGB (SIZE, SIZE, 3), edges antialiased by supersampling."""
    a = scene.attributes
    offsets = (np.arange(supersample) + 0.5) / supersample
    coords = (np.arange(SIZE)[:, None] + offsets[None, :]).reshape(-1)
    y, x = coords[:, None], coords[None, :]  # broadcast to the supersampled grid
    inside = _inside(a.shape or "", x, y, scene.side, scene.centre)
    coverage = inside.reshape(SIZE, supersample, SIZE, supersample).mean(axis=(1, 3))[..., None]
    background = np.array(PALETTE[a.background or ""], dtype=np.float64)
    colour = np.array(PALETTE[a.colour or ""], dtype=np.float64)
    return np.rint(background * (1 - coverage) + colour * coverage).astype(np.uint8)


def training_scenes(count: int, seed: int) -> list[Scene]:
    rng = np.random.default_rng(seed)
    return [random_scene(rng) for _ in range(count)]


def evaluation_prompts(count: int, start: int = EVALUATION_SEED_START) -> list[tuple[str, int]]:
    """(caption, seed) pairs cycling through every caption, with seeds training never used."""
    captions = [a.caption() for a in all_attributes()]
    return [(captions[i % len(captions)], start + i) for i in range(count)]


# -- reading an image back ---------------------------------------------------------------------

_NAMES = list(PALETTE)
_COLOURS = np.array([PALETTE[n] for n in _NAMES], dtype=np.float64)


def nearest_colour(rgb: Any) -> str:
    distances = np.linalg.norm(_COLOURS - np.asarray(rgb, dtype=np.float64), axis=1)
    return _NAMES[int(np.argmin(distances))]


def _largest_component(mask: Any) -> Any:
    """The largest 4-connected region of a boolean mask (stray pixels must not widen the box)."""
    height, width = mask.shape
    labels = np.zeros(mask.shape, dtype=np.int32)
    best_label, best_size, label = 0, 0, 0
    for start in zip(*np.nonzero(mask), strict=True):
        if labels[start]:
            continue
        label += 1
        labels[start] = label
        stack, size = [start], 0
        while stack:
            r, c = stack.pop()
            size += 1
            for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= nr < height and 0 <= nc < width and mask[nr, nc] and not labels[nr, nc]:
                    labels[nr, nc] = label
                    stack.append((nr, nc))
        if size > best_size:
            best_label, best_size = label, size
    return labels == best_label if best_size else mask


def kind_of(mask: Any) -> str:
    """circle, square or triangle, by the fraction of its bounding box the shape fills."""
    rows, cols = np.nonzero(mask)
    box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
    fill = len(rows) / box
    if fill > SQUARE_ABOVE:
        return "square"
    return "circle" if fill > CIRCLE_ABOVE else "triangle"


def read_back(image: Any) -> Attributes:
    """The background, the shape's colour and its kind, read from an RGB image's pixels."""
    pixels = np.asarray(image, dtype=np.float64)[..., :3]
    frame = np.ones(pixels.shape[:2], dtype=bool)
    frame[BORDER:-BORDER, BORDER:-BORDER] = False
    border = np.median(pixels[frame], axis=0)
    mask = np.linalg.norm(pixels - border, axis=-1) > SHAPE_DISTANCE
    mask[frame] = False  # the shape never touches the frame; what does is background noise
    if mask.sum() < MIN_SHAPE_PIXELS:
        return Attributes(None, None, nearest_colour(border))
    colour = np.median(pixels[_largest_component(mask)], axis=0)
    # The shape's outline, halfway between the two colours: a soft edge then moves no area in or
    # out of the shape, whichever colours it separates (a fixed distance from the background would
    # grow a white shape on black by the width of its blur, and round a square's corners).
    along = colour - border
    halfway = ((pixels - border) @ along) / max(float(along @ along), 1e-9) > 0.5
    halfway[frame] = False
    shape = _largest_component(halfway)
    if shape.sum() < MIN_SHAPE_PIXELS:
        return Attributes(None, None, nearest_colour(border))
    return Attributes(nearest_colour(colour), kind_of(shape), nearest_colour(border))


def adheres(prompt: str, image: Any) -> bool:
    """Strict: the image shows every attribute the prompt names (a prompt of another world fails)."""
    wanted = parse_caption(prompt)
    return wanted is not None and read_back(image) == wanted


def adherence(pairs: Sequence[tuple[str, Any]] | Iterator[tuple[str, Any]]) -> float:
    """The fraction of (prompt, image) pairs whose image adheres to its prompt."""
    results = [adheres(prompt, image) for prompt, image in pairs]
    return sum(results) / len(results) if results else 0.0
