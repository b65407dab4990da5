"""pytest plugin: the end-of-run summary's sections (setup step timings, kept logs), from every
pytest process of the run.

hack/test.sh runs the suite on pytest-xdist workers (tests/parallel_plugin.py); the fixtures that
time a setup step or keep a failed component's logs run in a worker, whose stash the terminal
summary (printed by the controller) never sees. So each process records into its own stash, a
worker hands what it recorded to the controller when it finishes (xdist's `workeroutput`), and
the controller prints one section per name, each entry tagged with the worker that made it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

Entries = dict[str, dict[str, float | str]]
_ENTRIES = pytest.StashKey[Entries]()
_WORKER_OUTPUT_KEY = "muralist-summary"


def section(config: pytest.Config, name: str) -> dict[str, float | str]:
    """The entries of section `name` (step -> seconds, or label -> text), created empty."""
    return config.stash.setdefault(_ENTRIES, {}).setdefault(name, {})


@contextmanager
def timed(config: pytest.Config, name: str, step: str) -> Iterator[None]:
    """Add the block's duration to `step` of section `name` (a step may repeat: its time adds up)."""
    start = time.monotonic()
    try:
        yield
    finally:
        entries = section(config, name)
        entries[step] = float(entries.get(step, 0.0)) + time.monotonic() - start


def note(config: pytest.Config, name: str, label: str, text: str) -> None:
    section(config, name)[label] = text


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output[_WORKER_OUTPUT_KEY] = session.config.stash.get(_ENTRIES, {})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    theirs: Entries = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT_KEY, {})
    worker = node.gateway.id
    for name, entries in theirs.items():
        ours = section(node.config, name)
        for label, value in entries.items():
            ours[f"{label} [{worker}]"] = value


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for name, entries in sorted(config.stash.get(_ENTRIES, {}).items()):
        if not entries:
            continue
        terminalreporter.section(name)
        for label, value in entries.items():
            line = f"{label:<48} {value:7.1f} s" if isinstance(value, float) else f"{label}: {value}"
            terminalreporter.write_line(line)
