"""mypy (hack/checks.sh types) checks every module of the API, the operator, the runtime and the client strictly: a
package is in [tool.mypy]'s `files` whole, so a new module is checked the day it is added, and the runtime's
parallel strategies are held to their Protocol (model/strategies.py's REGISTRY) like everything else."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.paths import REPO

STRICT = ["api/muralist_api", "operator/muralist_operator", "runtime/muralist_runtime", "cli/muralist"]


def mypy_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]


def checked(files: list[str]) -> set[Path]:
    out: set[Path] = set()
    for entry in files:
        path = REPO / entry
        out |= set(path.rglob("*.py")) if path.is_dir() else {path}
    return out


@pytest.mark.parametrize("package", STRICT)
def test_mypy_checks_every_module_of_the_package(package: str) -> None:
    modules = {p for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts}
    missed = sorted(str(p.relative_to(REPO)) for p in modules - checked(mypy_config()["files"]))
    assert not missed, f"mypy does not check {missed}: list {package} whole in [tool.mypy] files"


def test_mypy_is_strict() -> None:
    config = mypy_config()
    assert config["strict"] is True and config["warn_unreachable"] is True
