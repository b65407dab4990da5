"""The maps stay true: names that hold, package docstrings that list the modules there are, and paths in
CONTRIBUTING.md that exist.

A newcomer finds a concept through CONTRIBUTING.md's table and each package's docstring, and reads a
class by its name: a module left out of its package's docstring, a path that moved, or two public classes
of one name (which of the two `Termination`s is this?) send them the wrong way.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.paths import REPO

PRODUCT = [REPO / "api" / "muralist_api", REPO / "operator" / "muralist_operator",
           REPO / "runtime" / "muralist_runtime", REPO / "cli" / "muralist", REPO / "cli" / "muralist_cli"]


def product_modules() -> list[Path]:
    return sorted(p for root in PRODUCT for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_two_public_classes_of_the_product_share_a_name() -> None:
    defined: dict[str, list[str]] = defaultdict(list)
    for path in product_modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined[node.name].append(str(path.relative_to(REPO)))
    twice = {name: places for name, places in defined.items() if len(places) > 1}
    assert not twice, f"public classes of one name in several modules (rename one to say what it holds): {twice}"


def packages() -> list[Path]:
    return sorted(p.parent for root in PRODUCT for p in root.rglob("__init__.py") if "__pycache__" not in p.parts)


def members(package: Path) -> list[str]:
    """A package's modules and subpackages (their names, subpackages with a slash)."""
    out = [p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    out += [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(out)


def docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_package_docstring_names_every_module_of_its_package(package: Path) -> None:
    text = docstring(package)
    assert text, f"{package.relative_to(REPO)}/__init__.py has no docstring: say what the package holds"
    missing = [m for m in members(package) if not re.search(rf"(?<![\w.]){re.escape(m.rstrip('/'))}(?![\w])", text)]
    assert not missing, f"{package.relative_to(REPO)}/__init__.py's docstring does not name {missing}"


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(REPO)))
def test_what_a_package_docstring_names_as_a_file_or_folder_exists(package: Path) -> None:
    # A module of this package (`claims.py`, `sources/`), not a path elsewhere (tests/unit/.../test_x.py).
    named = re.findall(r"(?<![\w/.])([a-z_][a-z0-9_]*)(\.py|/)(?![\w/])", docstring(package))
    stale = [f"{name}{kind}" for name, kind in named
             if not ((package / f"{name}.py").is_file() if kind == ".py" else (package / name).is_dir())]
    assert not stale, f"{package.relative_to(REPO)}/__init__.py names {stale}, which are not there"


def test_every_path_contributing_names_exists() -> None:
    text = (REPO / "CONTRIBUTING.md").read_text()
    paths = set(re.findall(r"`((?:api|operator|runtime|cli|hack|tests|docs|charts|benchmarks|deploy)/[^`\s:]*)`",
                           text))
    gone = sorted(p for p in paths if not (REPO / p.rstrip("/")).exists() and "*" not in p and "<" not in p)
    assert not gone, f"CONTRIBUTING.md names paths that are not there: {gone}"


# A module a newcomer can read whole: past this, it holds more than one concept (split it by concept).
MAX_LINES = 450


def test_no_product_module_is_over_the_size_of_one_concept() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in product_modules()}
    long = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert not long, f"product modules over {MAX_LINES} lines (split them by concept): {long}"
