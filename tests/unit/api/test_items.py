"""Items' text: what a tokenizer cannot take is named; what a UTF-8 place cannot hold is escaped. Items' own sizes."""

from __future__ import annotations

import pytest
from muralist_api.items import printable, text_problem


def test_a_lone_surrogate_is_named_with_its_place() -> None:
    assert text_problem("prompt", "a cat \ud83d") == (
        "prompt is not valid Unicode: a lone surrogate '\\ud83d' at character 6 (half of an emoji, cut off?); fix "
        "the row's text")
    assert text_problem("negativePrompt", "\udc00 blurry").startswith("negativePrompt is not valid Unicode")


@pytest.mark.parametrize("text", ["a cat", "un chat 🐈 é", "tab\tand\nnewline", "\x07 bell", "", None])
def test_text_a_tokenizer_takes(text: str | None) -> None:
    assert text_problem("prompt", text) is None


@pytest.mark.parametrize(("text", "shown"), [
    ("plain", "plain"),
    ("un chat 🐈 é", "un chat 🐈 é"),
    ("half \ud83d", "half \\ud83d"),
    ("bell\x07, nul\x00, del\x7f, c1\x85", "bell\\x07, nul\\x00, del\\x7f, c1\\x85"),
    ("tab\tand\nnewline", "tab\tand\nnewline"),
])
def test_printable_escapes_what_utf8_places_cannot_hold(text: str, shown: str) -> None:
    assert printable(text) == shown
    printable(text).encode("utf-8")  # never raises


def test_an_items_own_size_replaces_the_jobs_and_enters_its_request_digest() -> None:
    from muralist_api.contract.resume import request_digest
    from muralist_api.items import Item, Shape, row_items
    from muralist_api.job import DiffusionJobSpec

    spec = DiffusionJobSpec.model_validate({"model": {"name": "m"}, "prompts": ["a"],
                                            "generation": {"height": 64, "width": 64}})
    plain, = row_items(0, "a", spec.generation)
    tall, = row_items(0, "a", spec.generation, height=96)
    assert (plain.shape(spec.generation), tall.shape(spec.generation)) == (Shape(64, 64), Shape(96, 64))
    assert request_digest(spec, tall, {}) != request_digest(spec, plain, {}), "another size is another request"
    # An item without a size of its own digests as before sizes existed (its resume keeps its outputs).
    before = Item(row=0, image_index=0, prompt="a", seed=plain.seed)
    assert request_digest(spec, plain, {}) == request_digest(spec, before, {})
    assert Shape(64, 96, 17).describe() == "96x64x17"
