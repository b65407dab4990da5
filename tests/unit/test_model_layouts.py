"""The admission table of model layouts agrees with the installed diffusers."""

from __future__ import annotations

import pytest
from muralist_runtime.spec import MODEL_LAYOUTS, ValidationProblem

from tests.builders import make_job

diffusers = pytest.importorskip("diffusers")


@pytest.mark.parametrize("layout", MODEL_LAYOUTS.values(), ids=lambda layout: layout.pipeline)
def test_table_matches_diffusers_plans(layout) -> None:
    transformer = getattr(diffusers, layout.transformer)
    assert hasattr(diffusers, layout.pipeline)
    assert bool(getattr(transformer, "_cp_plan", None)) == layout.context_parallel
    assert bool(getattr(transformer, "_tp_plan", None)) == layout.tensor_parallel


@pytest.mark.parametrize(("model", "pipeline", "strategy"), [
    ("stabilityai/stable-diffusion-xl-base-1.0", None, "cp"),
    ("my-org/private-model", "StableDiffusionPipeline", "cp"),
    ("Wan-AI/whatever", "WanPipeline", "tp"),
])
def test_admission_refuses_layouts_the_model_cannot_run(model: str, pipeline: str | None, strategy: str) -> None:
    builder = make_job().set("spec.model.name", model)
    if pipeline:
        builder.set("spec.model.pipeline", pipeline)
    builder = builder.context_parallel(ulysses=2) if strategy == "cp" else builder.tensor_parallel(degree=2)
    with pytest.raises(ValidationProblem, match=r"spec\.parallelism\.strategy: .* has none in diffusers"):
        builder.world(gpus=2).job()


def test_unknown_models_are_left_to_the_runtime() -> None:
    assert make_job().set("spec.model.name", "my-org/new-model").context_parallel(ulysses=2).world(gpus=2).job()
