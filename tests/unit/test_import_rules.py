"""What import-linter (the contracts in pyproject.toml) cannot see: an import by name at run time.

`importlib.import_module("kubernetes.config")` imports a dependency as surely as `from kubernetes
import config`, but no contract sees it, so a module could break one unseen. Product code imports
what it names with the import statement (inside a function where it must stay lazy); only a name
that is not known until run time (the zygote's preload of what its caller names) goes through
importlib.
"""

from __future__ import annotations

import ast

from tests.paths import REPO

PRODUCT = [REPO / "api" / "muralist_api", REPO / "operator" / "muralist_operator",
           REPO / "runtime" / "muralist_runtime", REPO / "cli" / "muralist", REPO / "cli" / "muralist_cli"]


def _imports_by_name(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of each `importlib.import_module("...")` or `__import__("...")` whose module is
    written out: one the import statement could say."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
            isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))
        first = node.args[0]
        if named and isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.append((node.lineno, first.value))
    return found


def test_no_product_module_imports_a_module_it_names_through_importlib() -> None:
    found = [f"{path.relative_to(REPO)}:{line}: {module}"
             for root in PRODUCT for path in sorted(root.rglob("*.py")) if "__pycache__" not in path.parts
             for line, module in _imports_by_name(ast.parse(path.read_text()))]
    assert not found, f"import these with the import statement, where import-linter sees them: {found}"


def test_the_check_finds_both_spellings() -> None:
    tree = ast.parse("import importlib\nimportlib.import_module('kubernetes.watch')\n__import__('kopf')\n"
                     "importlib.import_module(name)\n")
    assert _imports_by_name(tree) == [(2, "kubernetes.watch"), (3, "kopf")]
