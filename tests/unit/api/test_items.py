"""Items' text: what a tokenizer cannot take is named; what a UTF-8 place cannot hold is escaped."""

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
