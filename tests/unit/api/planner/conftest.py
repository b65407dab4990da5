"""Hub-shaped folders of the public models (sparse safetensors: real headers, no data), once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.planner_models import write_public_models


@pytest.fixture(scope="session")
def public_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_public_models(tmp_path_factory.mktemp("public-models"))
