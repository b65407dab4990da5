"""A rank's job folder at set-up: the host writes job.json, a writing rank gets its layout
prepared, the others none; a folder of other parameters is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from muralist_api.contract import PermanentFailure
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.outputs.job_folder import open_job_folder
from muralist_runtime.work.chunks import make_plan
from muralist_runtime.world.distributed import Layout


def runtime(out: Path, steps: int = 2) -> RuntimeSpec:
    return RuntimeSpec.model_validate({
        "name": "w", "outputDir": str(out),
        "spec": {"model": {"name": "muralist/tiny-flux", "dtype": "float32"}, "prompts": ["a cat", "a dog"],
                 "generation": {"steps": steps}},
    })


def layout(pod_index: int, local_rank: int, group_size: int = 1) -> Layout:
    return Layout(pod_index=pod_index, local_rank=local_rank, local_world_size=2, nodes=1, group_size=group_size,
                  pg_rank=local_rank, pg_size=2)


def test_the_host_writes_the_world_and_writers_get_a_prepared_layout(tmp_path: Path) -> None:
    spec = runtime(tmp_path / "out")
    work = make_plan(spec.spec, 2, 0)
    jobfile, resumed, files = open_job_folder(spec, work, layout(0, 0))
    assert resumed == work and files is not None and files.images.is_dir()
    assert json.loads(jobfile.path.read_text())["world"]["worldSize"] == 2
    _, _, silent = open_job_folder(spec, work, layout(0, 1, group_size=2))
    assert silent is None, "a group's second rank writes nothing"


def test_a_folder_of_other_parameters_is_refused(tmp_path: Path) -> None:
    work = make_plan(runtime(tmp_path).spec, 2, 0)
    open_job_folder(runtime(tmp_path), work, layout(0, 0))
    with pytest.raises(PermanentFailure):
        open_job_folder(runtime(tmp_path, steps=3), work, layout(0, 0))
