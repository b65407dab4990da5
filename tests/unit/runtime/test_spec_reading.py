"""A runtime spec written by a newer operator (contract/versions.py): the launch entry point starts the
world it describes, and the ranks refuse a field this image lacks by name (exit 78, with the build), so
the pod fails at once, permanently, instead of being retried on a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from muralist_api import contract
from muralist_api.contract import PermanentFailure
from muralist_api.contract.versions import build
from muralist_runtime import launch, main


@pytest.fixture
def newer_spec(tmp_path: Path) -> Path:
    spec = {"name": "cats", "outputDir": str(tmp_path / "out"),
            "spec": {"model": {"name": "muralist/tiny-flux"}, "prompts": ["a cat"],
                     "parallelism": {"gpusPerNode": 0, "processesPerNode": 2},
                     "generation": {"steps": 2, "futureGuard": "strict", "futureUnset": None}}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_the_ranks_refuse_a_field_this_image_lacks_naming_it_and_the_build(newer_spec: Path) -> None:
    with pytest.raises(PermanentFailure) as refused:
        main.read_spec(str(newer_spec))
    assert refused.value.field == "spec.generation.futureGuard"
    assert f"not supported by this runtime image ({build()})" in str(refused.value)


def test_the_launch_entry_point_starts_the_world_for_the_ranks_to_refuse_it(newer_spec: Path) -> None:
    argv, pet = launch.agent_command(str(newer_spec), {contract.MURALIST_POD_INDEX: "0"})
    assert pet[contract.PET_NPROC_PER_NODE] == "2" and argv[-2:] == ["--spec", str(newer_spec)]


def test_a_field_it_does_not_know_left_unset_is_no_reason_to_refuse(newer_spec: Path) -> None:
    spec = json.loads(newer_spec.read_text())
    del spec["spec"]["generation"]["futureGuard"]
    newer_spec.write_text(json.dumps(spec))
    assert main.read_spec(str(newer_spec)).spec.generation.steps == 2
