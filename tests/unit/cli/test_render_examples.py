"""`muralist render` of every example, against the output recorded in tests/fixtures/render/.

A refactor must not change what the operator creates: the same manifest renders the same
objects, byte for byte. When a change is meant to alter them, regenerate the files and review
the diff like any other change:

    PYTHONPATH=api:cli:operator:runtime python -m tests.unit.cli.test_render_examples
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from muralist_api import contract
from muralist_cli import main as cli

from tests.paths import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
RECORDED = REPO / "tests" / "fixtures" / "render"


def rendered(example: Path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["render", str(example)]) == 0
    return out.getvalue()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_an_example_renders_the_objects_recorded_for_it(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.MURALIST_RUNTIME_IMAGE, raising=False)  # the operator's default image
    recorded = RECORDED / example.name
    assert recorded.is_file(), f"no recorded render for {example.name}: regenerate (see this module's docstring)"
    assert rendered(example) == recorded.read_text()


def test_every_recorded_render_has_its_example() -> None:
    assert sorted(p.name for p in RECORDED.glob("*.yaml")) == [p.name for p in EXAMPLES]


if __name__ == "__main__":
    RECORDED.mkdir(parents=True, exist_ok=True)
    for old in RECORDED.glob("*.yaml"):
        old.unlink()
    for example in EXAMPLES:
        (RECORDED / example.name).write_text(rendered(example))
        print(f"recorded {example.name}")
