"""Trained tiny models that ship inside the runtime package (no build, no download).

`muralist/tiny-shapes-flux` is a FluxPipeline folder written by `hack/train_tiny_shapes.py`
(a trained AutoencoderKL and FluxTransformer2DModel, seeded random CLIP and T5 at toy size)
that draws the coloured shape a prompt like "a red circle on a blue background" asks for
(model/shapes.py reads it back). The folder is package data, so the runtime image and every pip
install carry it; `from_pretrained` reads it in place. SHA256SUMS beside the weights records what
the script wrote.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent / "weights"
BUNDLED_MODELS: dict[str, Path] = {
    "muralist/tiny-shapes-flux": WEIGHTS / "tiny-shapes-flux",
}
CHECKSUMS = "SHA256SUMS"
# The longest caption of the shapes world is 7 words: the model was trained on 8 text tokens
# (FluxPipeline's max_sequence_length), and renders what it was trained on only with those.
SHAPES_TEXT_TOKENS = 8


def bundled_model(name: str) -> Path:
    """The folder of the bundled model `name` (a key of BUNDLED_MODELS)."""
    try:
        return BUNDLED_MODELS[name]
    except KeyError:
        raise ValueError(f"no bundled model {name!r}; known: {sorted(BUNDLED_MODELS)}") from None


def checksum_mismatches(folder: Path) -> list[str]:
    """Files of `folder` whose sha256 differs from its SHA256SUMS (missing and unlisted ones too)."""
    recorded = {}
    for line in (folder / CHECKSUMS).read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        recorded[name] = digest
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS
               and "__pycache__" not in p.parts}
    wrong = [name for name in sorted(recorded) if name not in present
             or hashlib.sha256((folder / name).read_bytes()).hexdigest() != recorded[name]]
    return wrong + sorted(present - set(recorded))
