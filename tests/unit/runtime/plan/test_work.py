"""The plan of a job's work, before the world: its rows, its chunks, its first item."""

from __future__ import annotations

from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.plan.work import plan_work

from tests.builders import JobBuilder


def runtime(**dataset: object) -> RuntimeSpec:
    spec = JobBuilder().prompts("a fox", "a lighthouse", "a robot").obj()["spec"]
    spec.update(dataset)
    return RuntimeSpec.model_validate({"name": "t", "spec": spec, "outputDir": "/unused"})


def test_the_rows_the_chunks_and_the_first_item() -> None:
    rows, work, first = plan_work(runtime())
    assert rows.count() == 3 and work.rows == 3 and work.total_items >= 3
    assert first.prompt == "a fox"
