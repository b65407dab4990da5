"""benchmarks/straggler.py's reading of a run: what it accepts and what it refuses."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture(scope="module")
def straggler() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling dataset_job
    try:
        spec = importlib.util.spec_from_file_location("straggler_under_test", BENCHMARKS / "straggler.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def one_pod_run(straggler: ModuleType, tmp_path: Path, by_rank: dict[int, int], logs: list[str]) -> object:
    """A finished 1-pod x 2-process run: the manifest and PNGs by rank, the pod's log lines and its
    termination message (rank 0's generateSeconds)."""
    (tmp_path / "images").mkdir()
    entries = []
    for rank, count in by_rank.items():
        for i in range(count):
            key = f"r{rank}-{i}"
            entries.append({"key": key, "status": "rendered", "rank": rank})
            (tmp_path / "images" / f"{key}.png").write_bytes(b"png")
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    return straggler.JobRun(name="r0-1x2-dynamic", output=tmp_path, codes=[0], wall_s=5.0,
                            logs=["\n".join(logs)], terminations=[{"generateSeconds": 0.008}])


def test_a_rank_that_rendered_nothing_is_measured_and_left_out_of_the_span(straggler: ModuleType,
                                                                           tmp_path: Path) -> None:
    # The second rank claimed all 8 items before the first had loaded (seen in a CI run).
    run = one_pod_run(straggler, tmp_path, {1: 8}, [
        "2026-12-03 14:40:01,000 muralist: rendered 8 items in 0.9s (load 1.0s)",
        "2026-12-03 14:40:03,000 muralist: rendered 0 items in 0.0s (load 3.0s)",
    ])
    measured = straggler.measure(run, 8)
    assert measured.images == {1: 8}
    assert measured.generate == {0: 0.008, 1: 0.9}
    assert measured.span_s == pytest.approx(0.9)  # the working rank's generation, not the late rank's end


def test_a_rank_with_images_but_no_timing_is_refused(straggler: ModuleType, tmp_path: Path) -> None:
    run = one_pod_run(straggler, tmp_path, {0: 4, 1: 4}, [
        "2026-12-03 14:40:01,000 muralist: rendered 4 items in 0.5s (load 1.0s)",
    ])
    with pytest.raises(SystemExit, match="rendered 4 items' log line for rank"):
        straggler.measure(run, 8)
