"""The termination message's cache sample (generation.cache.verify): on the wire and back, and summed."""

from __future__ import annotations

import json

from muralist_api.contract import CacheSample, Counts, Termination


def test_the_cache_sample_survives_the_termination_message() -> None:
    sample = CacheSample(3, 28.123456, 0.9512345678, cache_off=True)
    text = Termination(Counts(completed=4, total=4), timings={"loadSeconds": 1.5}, cache_sample=sample).to_json()
    assert json.loads(text)["cacheVerify"] == {"sampled": 3, "minPsnr": 28.123, "minSsim": 0.951235, "cacheOff": True}
    parsed = Termination.parse(text)
    assert parsed is not None
    assert parsed.cache_sample == CacheSample(3, 28.123, 0.951235, True)
    assert parsed.timings == {"loadSeconds": 1.5}, "the sample is not a timing"
    plain = Termination.parse(Termination(Counts()).to_json())
    assert plain is not None and plain.cache_sample is None


def test_samples_sum_their_counts_and_keep_the_lowest_figures() -> None:
    identical = CacheSample(2, None, 1.0)  # every item identical: no finite PSNR
    measured = CacheSample(1, 31.0, 0.98)
    assert identical.combine(measured) == CacheSample(3, 31.0, 0.98, False)
    assert measured.combine(None) == measured
    assert CacheSample(1, 40.0, 0.99).combine(CacheSample(1, 25.0, 0.995, cache_off=True)) == CacheSample(
        2, 25.0, 0.99, True)


def test_what_is_no_sample_reads_as_none() -> None:
    for doc in (None, [], {"sampled": "3"}, {"minPsnr": 30}):
        assert CacheSample.from_wire(doc) is None


def test_the_merged_steps_of_checkpoints_survive_the_termination_message() -> None:
    from muralist_api.contract.counts import CheckpointSteps

    steps = CheckpointSteps(saved=12, lost=3)
    text = Termination(Counts(completed=2, total=2), timings={"checkpointSeconds": 0.25, "checkpointsWritten": 4},
                       job=Counts(completed=2, total=2), checkpoints=steps).to_json()
    assert json.loads(text)["checkpoints"] == {"stepsSaved": 12, "stepsLost": 3}
    parsed = Termination.parse(text)
    assert parsed is not None and parsed.checkpoints == steps
    assert parsed.timings == {"checkpointSeconds": 0.25, "checkpointsWritten": 4}, "the steps are no timing"
    plain = Termination.parse(Termination(Counts()).to_json())
    assert plain is not None and plain.checkpoints is None
    for doc in (None, [], {"stepsSaved": "3"}, {"stepsSaved": -1, "stepsLost": True}):
        found = CheckpointSteps.from_wire(doc)
        assert found is None or found == CheckpointSteps(0, 0)
