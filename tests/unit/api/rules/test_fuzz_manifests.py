"""Bad input at volume: thousands of mutated manifests, derived from examples/, against
`muralist validate` and the operator's admission path; none may raise, every refusal names a field.

Each example is mutated one to four times (wrong types, missing and extra fields, huge values,
unicode, deep nesting, nulls, lists for maps, known field names in the wrong place). Every
mutant goes through what `muralist validate` runs (validate_files, YAML text on stdin) and
through what the operator runs before it creates children (parse_job, then decide and
render_children for a job it accepts, as reconciler._reconcile does), in process. Derandomized:
the same mutants on every run.
"""

from __future__ import annotations

import io
import json
import re
import reprlib
import sys
from datetime import UTC, datetime
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from muralist_api.job import DiffusionJob
from muralist_api.rules.problems import ValidationProblem, parse_job
from muralist_api.status import DiffusionJobStatus
from muralist_operator.decision import CreateJob
from muralist_operator.lifecycle import decide
from muralist_operator.manifests import validate_files
from muralist_operator.observe import Observed
from muralist_operator.render import RenderError, render_children
from muralist_operator.settings import OperatorSettings

from tests.paths import REPO

EXAMPLES: list[dict[str, Any]] = [
    doc for path in sorted((REPO / "examples").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
    if isinstance(doc, dict) and doc.get("kind") == "DiffusionJob"
]
MUTANTS = 5_000
# A refusal starts with the field it is about (`spec.generation.steps: ...`, `metadata.name: ...`,
# `apiVersion/kind: ...`); the CLI puts `FILE#doc (name): ` before it.
FIELD = re.compile(r'(?:^|: )(?:apiVersion/kind|metadata|spec)(?:\.[\w-]+|\[\d+\]|\["(?:[^"\\]|\\.)*"\])*: \S')

YAML_POSITION = re.compile(r"^-: not valid YAML at line \d+, column \d+: ")


def _field_names(schema: dict[str, Any]) -> list[str]:
    """Every property name the API knows, to put known names in the wrong places."""
    names: set[str] = set()
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            names.update(node.get("properties", {}) if isinstance(node.get("properties"), dict) else ())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return sorted(names)


KNOWN_FIELDS = _field_names(DiffusionJob.model_json_schema(by_alias=True))


def nested(depth: int, as_map: bool) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value} if as_map else [value]
    return value


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63) - 1, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", " ", "\t\n", "\x00", "\u202e", "🎨" * 300, "x" * 300_000, "../../etc", "/abs", "1e400",
                     "null", "~", "true", "0x10", "float64", "DataParallel", "muralist/tiny-flux", "32Gi"]),
)
values = st.one_of(
    scalars, scalars, scalars,  # weights: the cheap, common mistakes most often
    st.lists(scalars, max_size=4),
    st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(KNOWN_FIELDS)), scalars, max_size=4),
)
# Values that cost tens of milliseconds each to write and read: one replacement in 40.
expensive = st.one_of(
    st.builds(nested, st.sampled_from([1100, 3000]), st.booleans()),  # past every parser's depth limit
    st.builds(nested, st.integers(20, 200), st.booleans()),
    st.builds(lambda: ["a prompt"] * 2000),  # a new one each time: mutants change it
)


def paths(tree: Any) -> list[tuple[Any, ...]]:
    """The path of every node of a manifest (the first 8 items of a list), in a fixed order."""
    out: list[tuple[Any, ...]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), tree)]
    while stack:
        path, node = stack.pop()
        if path:
            out.append(path)
        if len(path) > 12:
            continue
        if isinstance(node, dict):
            stack.extend(((*path, k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node[:8]))
    return out


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree


OPERATIONS = st.sampled_from(["replace", "delete", "extra", "null", "listify", "unwrap", "stringify", "empty",
                              "known-elsewhere"])
EXAMPLE_TEXTS = [json.dumps(doc) for doc in EXAMPLES]  # a fresh copy of an example: json.loads, fast
examples = st.sampled_from(EXAMPLE_TEXTS).map(json.loads)
new_keys = st.one_of(st.text(max_size=10), st.sampled_from(KNOWN_FIELDS))


@st.composite
def mutants(draw: st.DrawFn) -> dict[str, Any]:
    doc = draw(examples)
    for _ in range(draw(st.integers(1, 4))):
        where = paths(doc)
        if not where:
            break
        where_to = where[draw(st.integers(0, len(where) - 1))]
        parent, key = _get(doc, where_to[:-1]), where_to[-1]
        op, old = draw(OPERATIONS), parent[key]
        if op == "delete":
            del parent[key]
        elif op == "extra" and isinstance(old, dict):
            old[draw(new_keys)] = draw(values)
        elif op == "known-elsewhere" and isinstance(old, dict):  # a real field name, or a whole job, misplaced
            old[draw(st.sampled_from(KNOWN_FIELDS))] = draw(st.one_of(values, examples))
        elif op == "null":
            parent[key] = None
        elif op == "listify":  # a list where a map (or a scalar) belongs
            parent[key] = [list(kv) for kv in old.items()] if isinstance(old, dict) and draw(st.booleans()) else [old]
        elif op == "unwrap" and isinstance(old, list | dict) and old:
            parent[key] = next(iter(old.values())) if isinstance(old, dict) else old[0]
        elif op == "stringify":
            parent[key] = reprlib.repr(old) if isinstance(old, list | dict) else str(old)
        elif op == "empty":
            parent[key] = type(old)() if isinstance(old, list | dict | str) else ""
        else:  # replace (and what does not apply to this node)
            parent[key] = draw(expensive if draw(st.integers(0, 39)) == 0 else values)
    return doc


def admit(manifest: dict[str, Any]) -> list[str]:
    """What the operator does before creating children (reconciler._reconcile): the refusal's lines."""
    try:
        job = parse_job(manifest)
    except ValidationProblem as e:
        assert e.problems, "a refusal without a reason"
        return e.problems
    decision = decide(job, DiffusionJobStatus(), 1, Observed(), datetime.now(UTC))
    create = next((a for a in decision.actions if isinstance(a, CreateJob)), None)
    assert create is not None, decision
    try:
        render_children(job, "default", OperatorSettings(), active_deadline_seconds=create.active_deadline_seconds)
    except RenderError as e:
        return [str(e)]
    return []


def validate_cli(text: str) -> tuple[int, str, str]:
    """`muralist validate -` with `text` on stdin, in process."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr, sys.stdin = out, err, io.StringIO(text)
    try:
        code = validate_files(["-"])
    finally:
        sys.stdout, sys.stderr, sys.stdin = old
    return code, out.getvalue(), err.getvalue()


def _dump(doc: Any) -> str:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # PyYAML's representer recurses once per level of a deep value
    try:
        return yaml.dump(doc, Dumper=yaml.CSafeDumper, allow_unicode=True, sort_keys=False)
    finally:
        sys.setrecursionlimit(limit)


def test_thousands_of_mutated_manifests_are_refused_by_field_and_never_crash() -> None:
    assert len(EXAMPLES) >= 10
    ran: list[int] = []

    @settings(max_examples=MUTANTS, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(mutants())
    def check(manifest: dict[str, Any]) -> None:
        ran.append(1)
        refusal = admit(manifest)
        unnamed = [line for line in refusal if not FIELD.search(line)]
        assert not unnamed, f"refusals that name no field: {unnamed}"
        code, out, err = validate_cli(_dump(manifest))
        assert "Traceback" not in err
        assert (code, bool(out), bool(err)) == ((1, False, True) if refusal else (0, True, False)), (code, out, err)
        # A value nested past libyaml's 1,000 levels cannot be read at all: named by line and column.
        unnamed = [line for line in err.splitlines() if not FIELD.search(line) and not YAML_POSITION.match(line)]
        assert not unnamed, f"`muralist validate` lines that name no field: {unnamed}"
        assert max(map(len, [*refusal, *err.splitlines()]), default=0) <= 1_000, "a refusal quotes too much"

    check()
    assert len(ran) >= MUTANTS, f"only {len(ran)} mutants ran"
