"""CEL rules declared beside what they guard, and the Python rules they mirror.

A rule the API server should check goes on the field it guards (`Annotated[T, CelRule(...)]`,
`self` is the field's value) or on a model (`cel_rules`, `self` is the model's object), as
jobset puts `XValidation` markers on its types; `muralist crd` collects them into the CRD's
`x-kubernetes-validations` (operator/muralist_operator/crd.py).

Each CEL rule names the Python rule it mirrors (`mirrors`), so admission by the API server and
validation by `muralist validate`, the operator and the runtime say the same thing. Each
Python rule is marked with `python_rule`, which says why it has no CEL form
when it has none; tests/unit/api/test_cel_rules.py checks both directions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

Rule = Callable[..., Any]
R = TypeVar("R", bound=Rule)

# Every Python rule marked below -> why it has no CEL form ("" when it has one).
PYTHON_RULES: dict[Rule, str] = {}


def python_rule(no_cel: str = "") -> Callable[[R], R]:
    """Mark a Python rule that CEL rules may mirror; `no_cel`: why the CRD does not check it."""

    def mark(rule: R) -> R:
        PYTHON_RULES[rule] = no_cel
        return rule

    return mark


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry and the Python rule it mirrors.

    A transition rule (one that reads `oldSelf`) mirrors none: Python checks a manifest, not a
    change to one; `cel_only` says so.
    """

    rule: str
    message: str
    mirrors: Rule | None = None
    cel_only: str = ""

    def wire(self) -> dict[str, str]:
        """The entry as the CRD writes it."""
        return {"rule": self.rule, "message": self.message}


def cel_list(names: list[str]) -> str:
    """A CEL list literal of strings."""
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"
