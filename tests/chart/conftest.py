"""Helpers for the chart tests: render charts/muralist with helm, apply manifests with kubectl.

helm, kubectl, promtool and dashboard-check come from the control plane's binary directory
(hack/cluster-binaries.sh builds them), or from PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster_plugin import load_controlplane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "muralist"


def find_tool(name: str) -> str | None:
    candidate = load_controlplane().default_bin_dir() / name
    if os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def require_tool(name: str) -> str:
    """A binary hack/cluster-binaries.sh builds: skipped without it, a failure in CI
    (MURALIST_REQUIRE_CLUSTER=1, where that script has run)."""
    path = find_tool(name)
    if path is None:
        reason = f"{name} not found: run hack/cluster-binaries.sh"
        if os.environ.get("MURALIST_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"{reason} (MURALIST_REQUIRE_CLUSTER=1)", pytrace=False)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def helm() -> str:
    return require_tool("helm")


def run(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    """Run a command; on failure the assertion shows its stderr (helm and kubectl explain there)."""
    proc = subprocess.run(
        args, input=stdin, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )
    assert proc.returncode == 0, f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
    return proc.stdout


def set_args(values: dict[str, Any]) -> list[str]:
    """--set-json flags, one per top-level value: exact types, no escaping of commas."""
    import json

    return [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]


def render(
    helm: str,
    values: dict[str, Any] | None = None,
    release: str = "muralist",
    namespace: str = "muralist-system",
    extra: Iterable[str] = (),
) -> list[dict[str, Any]]:
    out = run(helm, "template", release, str(CHART), "--namespace", namespace, *set_args(values or {}), *extra)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def dump(docs: Iterable[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False)


def kinds(docs: Iterable[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in docs]


def one(docs: Iterable[dict[str, Any]], kind: str, namespace: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d["kind"] == kind and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"expected one {kind} (namespace {namespace}), found {len(found)}"
    return found[0]
