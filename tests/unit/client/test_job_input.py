"""What `Client.create` accepts: every form checked by `muralist validate`'s rules before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from muralist.job_input import submission
from muralist_api.job import DiffusionJob
from muralist_api.manifests import ManifestError
from muralist_api.rules.problems import ValidationProblem

from tests.builders import make_job
from tests.paths import REPO

QUICKSTART = REPO / "examples" / "quickstart-cpu.yaml"


def test_every_form_gives_the_same_job() -> None:
    text = QUICKSTART.read_text()
    manifest = yaml.safe_load(text)
    forms = [QUICKSTART, str(QUICKSTART), text, manifest, DiffusionJob.model_validate(manifest)]
    subs = [submission(form) for form in forms]
    assert {s.name for s in subs} == {"quickstart"}
    assert all(s.job == subs[0].job for s in subs)
    assert [s.companions for s in subs] == [[]] * len(forms)
    # What is sent is the manifest as written (the API server applies the CRD's defaults), or the
    # typed model's own dump, which parses to the same job.
    assert subs[0].body == subs[2].body == manifest


def test_the_config_maps_beside_the_job_are_sent_first() -> None:
    sub = submission(REPO / "examples" / "prompts-from-configmap.yaml")
    assert [c["kind"] for c in sub.companions] == ["ConfigMap"]
    assert sub.job.spec.prompts_from is not None
    assert sub.companions[0]["metadata"]["name"] == sub.job.spec.prompts_from.config_map_key_ref.name


def test_a_problem_is_reported_by_its_field_and_nothing_is_built() -> None:
    bad = make_job("cats").generation(steps=0).obj()
    with pytest.raises(ValidationProblem) as err:
        submission(bad)
    assert err.value.problems[0].startswith("spec.generation.steps")
    with pytest.raises(ValidationProblem) as err:
        submission(yaml.safe_dump(bad))
    assert err.value.problems[0].startswith("-#0 (cats): spec.generation.steps")


def test_a_typed_model_changed_after_it_was_built_is_checked_again() -> None:
    job = DiffusionJob.model_validate(make_job("cats").obj())
    job.spec.generation.steps = 0  # pydantic does not validate assignments here
    with pytest.raises(ValidationProblem, match=r"spec\.generation\.steps"):
        submission(job)


def test_one_job_per_call_and_nothing_but_config_maps_beside_it(tmp_path: Path) -> None:
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump_all([make_job("a").obj(), make_job("b").obj()]))
    with pytest.raises(ManifestError, match="holds 2 DiffusionJobs"):
        submission(two)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"}}
    with pytest.raises(ManifestError, match="only ConfigMaps"):
        submission(yaml.safe_dump_all([make_job("a").obj(), secret]))
    with pytest.raises(ManifestError, match="no DiffusionJob"):
        submission(yaml.safe_dump(secret))
    with pytest.raises(ManifestError, match="cannot read"):
        submission(tmp_path / "missing.yaml")
    with pytest.raises(TypeError):
        submission(42)  # type: ignore[arg-type]
