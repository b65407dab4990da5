"""Each CEL rule of the CRD names the Python rule it mirrors, and each Python rule has its CEL
form or says why not (muralist_api/cel.py)."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest
from muralist_api import job, parallelism, step_cache, storage
from muralist_api.cel import PYTHON_RULES, CelRule
from muralist_api.rules import catalog, sequence, workloads
from muralist_operator.crd import CEL_RULES

RULE_MODULES = (job, parallelism, storage, catalog, workloads, sequence, step_cache)
# Functions named like rules that are not one: they collect the rules below them.
COLLECTORS = {job.spec_problems}


def _rule_functions(module: ModuleType) -> list[object]:
    return [fn for name, fn in inspect.getmembers(module, inspect.isfunction)
            if fn.__module__ == module.__name__ and name.endswith(("_problem", "_problems"))
            and fn not in COLLECTORS]


def _cel_rules() -> list[CelRule]:
    return [rule for rules in CEL_RULES.values() for rule in rules]


def _name(rule: object) -> str:
    return f"{getattr(rule, '__module__', '?')}.{getattr(rule, '__qualname__', rule)}"


@pytest.mark.parametrize("module", RULE_MODULES, ids=lambda m: m.__name__)
def test_every_python_rule_is_marked(module: ModuleType) -> None:
    unmarked = [_name(fn) for fn in _rule_functions(module) if fn not in PYTHON_RULES]
    assert unmarked == [], "mark each with @python_rule() beside its CEL form, or @python_rule(no_cel=why)"


def test_every_python_rule_has_its_cel_form_or_says_why_not() -> None:
    mirrored = {rule.mirrors for rule in _cel_rules()}
    without_cel = [_name(fn) for fn, why in PYTHON_RULES.items() if not why and fn not in mirrored]
    assert without_cel == [], "no CEL rule mirrors these: declare one, or say why not (no_cel=...)"
    both = [_name(fn) for fn, why in PYTHON_RULES.items() if why and fn in mirrored]
    assert both == [], "these say they have no CEL form, but a CEL rule mirrors them"


def test_every_cel_rule_names_the_python_rule_it_mirrors() -> None:
    for rule in _cel_rules():
        if rule.mirrors is None:
            # Only a transition rule may stand alone: Python validates a manifest, not a change.
            assert rule.cel_only and "oldSelf" in rule.rule, rule.rule
        else:
            assert rule.mirrors in PYTHON_RULES, f"{rule.rule} mirrors {_name(rule.mirrors)}, not a marked rule"
            assert not rule.cel_only, rule.rule
