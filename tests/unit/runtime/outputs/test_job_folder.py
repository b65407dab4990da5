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


def runtime(out: Path, steps: int = 2, name: str = "w", shared: bool = False) -> RuntimeSpec:
    return RuntimeSpec.model_validate({
        "name": name, "outputDir": str(out),
        "spec": {"model": {"name": "muralist/tiny-flux", "dtype": "float32"}, "prompts": ["a cat", "a dog"],
                 "generation": {"steps": steps}, "output": {"shared": shared}},
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


def test_a_folder_of_another_job_is_refused_unless_shared(tmp_path: Path) -> None:
    work = make_plan(runtime(tmp_path).spec, 2, 0)
    open_job_folder(runtime(tmp_path), work, layout(0, 0))
    # The same job with another setting resumes: each item's request digest says what is kept. Records of
    # older versions (no digest) are kept only when the job-wide digest matches.
    _, _, files = open_job_folder(runtime(tmp_path, steps=3), work, layout(0, 0))
    assert files is not None and files.trust.legacy is False
    before = json.loads((tmp_path / "job.json").read_text())
    with pytest.raises(PermanentFailure) as refused:
        open_job_folder(runtime(tmp_path, name="other"), work, layout(0, 0))
    assert str(refused.value) == (
        f"spec.output: {tmp_path} holds the outputs of DiffusionJob default/w, not of default/other; use another "
        "spec.output.path, or set spec.output.shared: true to render into it (its items made for the same request "
        "are kept)")
    assert json.loads((tmp_path / "job.json").read_text()) == before, "refused before anything is written"
    open_job_folder(runtime(tmp_path, name="other", shared=True), work, layout(0, 0))
    assert json.loads((tmp_path / "job.json").read_text())["name"] == "other", "the folder is the sharer's now"


def test_a_job_json_that_is_not_one_is_refused_and_one_that_cannot_be_read_is_retried(tmp_path: Path) -> None:
    work = make_plan(runtime(tmp_path).spec, 2, 0)
    (tmp_path / "job.json").write_text("{not json")
    with pytest.raises(PermanentFailure, match=r"^spec.output.path: .*/job.json is not a job file of Muralist"):
        open_job_folder(runtime(tmp_path), work, layout(0, 0))
    assert (tmp_path / "job.json").read_text() == "{not json", "never overwritten"
    (tmp_path / "job.json").unlink()
    (tmp_path / "job.json").mkdir()  # reading it fails with an error that is not "missing"
    with pytest.raises(IsADirectoryError) as unreadable:
        open_job_folder(runtime(tmp_path), work, layout(0, 0))
    assert unreadable.value.__notes__[0].startswith(f"muralist: cannot read {tmp_path}/job.json now")
