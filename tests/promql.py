"""The metric names a PromQL expression reads: enough of PromQL's lexer to tell a metric name
from a function, a keyword, a label or a number (the syntax itself is promtool's to check)."""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")  # label matchers (strings already gone)
_RANGES = re.compile(r"\[[^\[\]]*\]")  # range and subquery durations
_MODIFIERS = re.compile(r"\b(?:offset\s+-?|@\s*)[0-9][0-9a-z.]*", re.IGNORECASE)  # offset 1h, @ 1700000000
# Label lists of aggregations and vector matching: names of labels, not of metrics.
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_TOKEN = re.compile(
    r"(?P<number>0x[0-9a-fA-F]+|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
)
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan", "start", "end"}
# Grafana's variables, replaced by values of the right kind before the expression is read.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def with_grafana_variables(expr: str, values: dict[str, str] | None = None) -> str:
    """A dashboard's expression as Prometheus gets it: built-in intervals as durations, the
    dashboard's own variables (`$name`, `${name}`) as `values` says (default: `.*`, all)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: (values or {}).get(m.group(1), ".*"), expr)


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects, bare (`up`) or in a selector (`up{job="x"}`)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _MODIFIERS.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in _TOKEN.finditer(text):
        name = match.group("name")
        if name is None or name.lower() in _KEYWORDS:
            continue
        if text[match.end():].lstrip().startswith("("):
            continue  # a function or an aggregation
        names.add(name)
    return names
