"""Cluster fixtures: the CRD applied once, and `muralist operator` running as a subprocess."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.operator_helpers import DJ, OperatorProcess, apply_crd


@pytest.fixture(scope="session")
def crd(kube_api: Any) -> dict[str, Any]:
    return apply_crd(kube_api)


@pytest.fixture(scope="session")
def operator(
    control_plane: Any, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(control_plane.kubeconfig, tmp_path_factory.mktemp("operator"))
    op.start()
    try:
        yield op
    finally:
        op.stop()
        if request.session.testsfailed:
            sys.stderr.write(f"\n--- operator log (last 200 lines) ---\n{''.join(op.logs().splitlines(True)[-200:])}\n")


@pytest.fixture
def dj(kube_api: Any, namespace: str, operator: OperatorProcess) -> DJ:
    return DJ(kube_api, namespace)
