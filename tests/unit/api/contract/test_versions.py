"""Reading what a newer version wrote (contract/versions.py, runtime_spec.py): the runtime spec holds
only what differs from its default, a field the reader does not know is set aside by name, and a field
that a job really uses is refused naming the field and this build; the API models still refuse typos."""

from __future__ import annotations

import json
from typing import Any

import pytest
from muralist_api.contract import PermanentFailure
from muralist_api.contract.versions import build, unknown_fields
from muralist_api.job import DiffusionJob
from muralist_api.rules.problems import ValidationProblem, parse_job
from muralist_api.runtime_spec import RuntimeSpec, read_runtime_spec, runtime_spec_json
from muralist_api.status import DiffusionJobStatus
from pydantic import ValidationError

from tests.builders import make_job


def spec_doc(**spec: Any) -> dict[str, Any]:
    return {"name": "cats", "spec": {"model": {"name": "muralist/tiny-flux"}, "prompts": ["a cat"], **spec},
            "outputDir": "/output/cats"}


def test_unknown_fields_are_found_at_any_depth_and_in_union_members() -> None:
    doc = spec_doc(runPolicy={"maxRestarts": 2, "futureTimeoutSeconds": 300},
                   prompts=["a cat", {"text": "a dog", "seed": 3, "futureWeight": 2.0}], future={"on": True})
    doc["addedLater"] = "x"
    known, found = unknown_fields(RuntimeSpec, doc)
    assert {f.path: f.value for f in found} == {"spec.runPolicy.futureTimeoutSeconds": 300,
                                                 "spec.prompts[1].futureWeight": 2.0, "spec.future": {"on": True},
                                                 "addedLater": "x"}
    assert known["spec"]["runPolicy"] == {"maxRestarts": 2}
    assert known["spec"]["prompts"][1] == {"text": "a dog", "seed": 3}
    assert "futureTimeoutSeconds" in doc["spec"]["runPolicy"], "the caller's data is left as it was"
    RuntimeSpec.model_validate(known)


def test_nothing_unknown_leaves_the_data_alone() -> None:
    doc = spec_doc()
    assert unknown_fields(RuntimeSpec, doc) == (doc, [])
    status = {"phase": "Running", "restarts": 1}
    assert unknown_fields(DiffusionJobStatus, status) == (status, [])


def test_a_field_this_image_lacks_is_refused_naming_it_and_the_build() -> None:
    text = json.dumps(spec_doc(generation={"steps": 4, "futureGuard": "strict"}))
    with pytest.raises(PermanentFailure) as refused:
        read_runtime_spec(text)
    assert refused.value.field == "spec.generation.futureGuard"
    message = str(refused.value)
    assert message.startswith("spec.generation.futureGuard: not supported by this runtime image (muralist ")
    assert build() in message and "image of the operator's release" in message and "remove the field" in message


def test_an_unknown_field_that_is_unset_is_ignored() -> None:
    runtime = read_runtime_spec(json.dumps(spec_doc(generation={"steps": 4, "futureGuard": None})))
    assert runtime.spec.generation.steps == 4


def test_the_launch_entry_point_reads_past_unknown_fields_for_the_ranks_to_refuse() -> None:
    text = json.dumps(spec_doc(parallelism={"gpusPerNode": 0, "processesPerNode": 2, "futureElastic": True}))
    assert read_runtime_spec(text, refuse_unknown=False).spec.parallelism.resolved_processes_per_node == 2


@pytest.mark.parametrize("doc", [spec_doc(generation={"steps": 0}), {**spec_doc(), "outputDir": 3}])
def test_other_problems_are_pydantics_errors(doc: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        read_runtime_spec(json.dumps(doc))
    with pytest.raises(ValidationError):  # also beside an unknown field
        read_runtime_spec(json.dumps({**doc, "addedLater": None}))
    with pytest.raises(ValidationError):
        read_runtime_spec("{not json")


def test_the_spec_on_the_wire_leaves_defaults_out_and_reads_back_whole() -> None:
    job = make_job("cats").run_policy(workloadSlices=False, maxRestarts=3).generation(steps=9).job()
    runtime = RuntimeSpec(name="cats", spec=job.spec, output_dir="/output/cats")
    wire = json.loads(runtime_spec_json(runtime))
    assert "runPolicy" not in wire["spec"] and "namespace" not in wire, "defaults, set or not, stay out"
    assert wire["spec"]["generation"]["steps"] == 9 and "guidanceScale" not in wire["spec"]["generation"]
    assert read_runtime_spec(runtime_spec_json(runtime)) == runtime


def test_admission_still_refuses_a_typo() -> None:
    manifest = make_job("cats").obj()
    manifest["spec"]["generation"]["stepz"] = 4
    with pytest.raises(ValidationProblem) as refused:
        parse_job(manifest)
    assert refused.value.problems == [
        "spec.generation.stepz: unknown field; check its spelling against `kubectl explain dj.spec.generation`"]
    with pytest.raises(ValidationError):
        DiffusionJob.model_validate(manifest)
