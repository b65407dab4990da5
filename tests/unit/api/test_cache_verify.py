"""generation.cache.verify: which share of the job is sampled, and the forms `sample` takes."""

from __future__ import annotations

import pytest
from muralist_api.step_cache import CacheVerify
from pydantic import ValidationError


@pytest.mark.parametrize(("sample", "total", "count"), [
    (1, 90, 1), (4, 90, 4), (200, 90, 90),  # a count, at most every item
    ("5%", 90, 5), ("5%", 100, 5), ("5%", 3, 1),  # rounded up, at least one item
    ("100%", 7, 7), ("0.5%", 1000, 5),
])
def test_sample_count(sample: int | str, total: int, count: int) -> None:
    assert CacheVerify(sample=sample).sample_count(total) == count


def test_defaults_measure_one_item_and_fail_on_a_missed_threshold() -> None:
    verify = CacheVerify()
    assert (verify.sample, verify.min_psnr, verify.min_ssim, verify.on_fail) == (1, None, None, "Fail")


@pytest.mark.parametrize(("fields", "words"), [
    ({"sample": 0}, "at least one item"),
    ({"sample": "5"}, "neither a count nor a percentage"),
    ({"sample": "150%"}, "at most 100"),
    ({"minPsnr": 0}, "greater than 0"),
    ({"onFail": "DisableCache"}, "set minPsnr or minSsim"),
])
def test_refused(fields: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        CacheVerify.model_validate(fields)


@pytest.mark.parametrize("model", ["sample", "maxFailedItems"])
def test_a_huge_count_or_percentage_is_quoted_by_its_start(model: str) -> None:
    # Found by the manifest fuzzer: a 300,000-character value was quoted whole in the refusal.
    from muralist_api.pods import RunPolicy

    cls, field = (CacheVerify, "sample") if model == "sample" else (RunPolicy, "maxFailedItems")
    with pytest.raises(ValidationError, match="neither a count nor a percentage") as refused:
        cls.model_validate({field: "x" * 300_000})
    assert len(str(refused.value)) < 1_000
