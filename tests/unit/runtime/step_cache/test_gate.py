"""The cache gate's bookkeeping without a model: which items are the sample, and how a verdict
left in the job folder (by another group, or an earlier attempt of this pod) turns the cache off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from muralist_api.items import row_items
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.outputs import storage
from muralist_runtime.outputs.layouts import RenderedOutput
from muralist_runtime.step_cache import verdict as cache_verdict
from muralist_runtime.step_cache.gate import CacheGate

from tests.builders import make_job


class Transformer:
    def __init__(self) -> None:
        self.disabled = 0

    def disable_cache(self) -> None:
        self.disabled += 1


class Pipe:
    def __init__(self) -> None:
        self.transformer = Transformer()


class World:
    """A group of one: its first rank's value is everyone's."""

    def share_in_group(self, value: Any) -> Any:
        return value


def not_rendered(*_args: Any, **_kwargs: Any) -> list[Any]:
    raise AssertionError("these tests render nothing")


def gate(tmp_path: Path, sample: int | str, prompts: int = 10, images: int = 2) -> CacheGate:
    job = make_job().prompts(*(f"p{i}" for i in range(prompts))).generation(
        imagesPerPrompt=images, cache={"type": "FirstBlockCache", "verify": {"sample": sample, "minPsnr": 30}})
    runtime = RuntimeSpec.model_validate({"name": "t", "spec": job.obj()["spec"], "outputDir": str(tmp_path)})
    found = CacheGate.for_job(runtime, 0, prompts * images, storage.at(tmp_path), not_rendered)
    assert found is not None
    return found


def test_the_sample_is_the_first_items_of_the_job(tmp_path: Path) -> None:
    sampled = gate(tmp_path, "15%")  # 3 of 20 items: rows 0 (both images) and 1 (its first)
    generation = sampled.runtime.spec.generation
    items = [item for row in range(3) for item in row_items(row, f"p{row}", generation)]
    assert [sampled.sampled(item) for item in items] == [True, True, True, False, False, False]


def test_a_verdict_in_the_folder_turns_the_cache_off_before_the_next_chunk(tmp_path: Path) -> None:
    first, pipe = gate(tmp_path, 1), Pipe()
    first.follow(pipe, World(), writes=True)
    assert first.off is None and pipe.transformer.disabled == 0, "no verdict yet"
    verdict = {"item": "00000-000", "missed": "minPsnr", "threshold": 30, "psnr": 21.5, "ssim": 0.9}
    cache_verdict.write_off(storage.at(tmp_path), tmp_path, verdict)
    first.follow(pipe, World(), writes=True)
    assert first.off == verdict and pipe.transformer.disabled == 1
    first.follow(pipe, World(), writes=True)
    assert pipe.transformer.disabled == 1, "once"
    # What it renders from then on is written without naming the cache.
    item = row_items(5, "p5", first.runtime.spec.generation)[0]
    output = RenderedOutput(image=object())
    assert first.check(pipe, [item], [(output, None)], None, writes=True) == [(output, None)]
    assert output.metadata == {"cache": None}


def test_a_retried_pod_starts_without_the_cache(tmp_path: Path) -> None:
    cache_verdict.write_off(storage.at(tmp_path), tmp_path, {"item": "00000-000", "missed": "minSsim"})
    retried, pipe = gate(tmp_path, 1), Pipe()
    retried.follow(pipe, World(), writes=True)
    assert retried.off is not None and pipe.transformer.disabled == 1
    assert retried.sample() is None, "it measured nothing itself"

