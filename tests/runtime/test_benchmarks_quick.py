"""The benchmarks that have a quick mode run to their table (their figures are not checked:
timings on a shared machine mean nothing in a test; every cell must hold one)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_plugin import load_controlplane
from tests.paths import REPO


def benchmark(name: str) -> Any:
    """A benchmark script as a module (its names: settings, labels)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The Markdown table a benchmark printed last: {first cell: cells}."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    assert len(lines) > 2, stdout[-2000:]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}


def test_cache_speed_quick(runtime_env: dict[str, str]) -> None:
    cache_speed = benchmark("cache_speed")
    proc = subprocess.run([sys.executable, "benchmarks/cache_speed.py", "--quick"], cwd=REPO, env=runtime_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert list(rows) == cache_speed.QUICK
    assert "load averages" in proc.stdout
    # Quality is deterministic (same seeds, one thread): the uncached run matches itself, and
    # the metrics tell the broken controls from a mild cache.
    assert rows["none"][4] == "inf / inf"
    mild_psnr_min = float(rows["FirstBlockCache 0.1"][4].split(" / ")[0])
    for control in cache_speed.CONTROLS:
        assert float(rows[control][4].split(" / ")[1]) < mild_psnr_min, rows[control]
    assert rows[cache_speed.ZEROED][6] == "0.0%", "an image of noise adheres to nothing"


NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")


def assert_numbers(rows: dict[str, list[str]], columns: int, dash_rows: tuple[str, ...] = ()) -> None:
    """Every row has all its columns, each a figure (a row listed in `dash_rows` may show '-' where
    it is its own baseline)."""
    for label, cells in rows.items():
        assert len(cells) == columns, (label, cells)
        for cell in cells[1:]:
            assert NUMBER.search(cell) or (cell == "-" and label in dash_rows), (label, cell, cells)


def run_quick(script: str, env: dict[str, str]) -> str:
    # The quick runs check that a benchmark runs to its table, not its figures: their ranks fork
    # from the session's zygote where their environment allows (runtime_throughput's does not: its
    # call-timing hook is on the ranks' PYTHONPATH, so they start the ordinary way).
    proc = subprocess.run([sys.executable, f"benchmarks/{script}", "--quick"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "load average" in proc.stdout
    return proc.stdout


def test_straggler_quick(runtime_env: dict[str, str], tiny_model: Path) -> None:
    out = run_quick("straggler.py", runtime_env)
    rows = table_rows(out)
    assert list(rows) == ["1 pod x 2 processes, dynamic", "1 pod x 2 processes, static"]
    assert_numbers(rows, 8)
    assert "byte-identical" in out, "the plans render the same images"


def test_runtime_throughput_quick(runtime_env: dict[str, str], tiny_model: Path) -> None:
    out = run_quick("runtime_throughput.py", runtime_env)
    rows = table_rows(out)
    assert list(rows) == ["reference (accelerate)", "muralist bs=1"]
    assert_numbers(rows, 6)
    assert "reference vs muralist bs=1 images: identical" in out


def test_dataset_job_quick(runtime_env: dict[str, str], tiny_model: Path) -> None:
    out = run_quick("dataset_job.py", runtime_env)
    lines = [line for line in out.splitlines() if line.startswith("| jsonl")]
    assert [line.split("|")[2].strip() for line in lines] == ["5,000", "10"], out[-2000:]
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 10 and all(NUMBER.search(c) or c == "-" for c in cells[1:]), cells
    assert "reading path: peak MiB" in out


@pytest.mark.cluster
def test_operator_scale_quick(runtime_env: dict[str, str]) -> None:
    controlplane = load_controlplane()
    bin_dir = controlplane.default_bin_dir()
    if missing := controlplane.missing_binaries(bin_dir):
        reason = f"control plane binaries missing in {bin_dir} ({', '.join(missing)}): run hack/cluster-binaries.sh"
        if os.environ.get("MURALIST_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    rows = table_rows(run_quick("operator_scale.py", runtime_env))
    assert list(rows) == ["3"]
    assert_numbers(rows, 11)


def test_peers_quick(runtime_env: dict[str, str]) -> None:
    peers = benchmark("peers")
    rows = table_rows(run_quick("peers.py", runtime_env))
    assert list(rows) == list(peers.QUICK_VARIANTS)
    for label, cells in rows.items():
        assert len(cells) == 7 and all(NUMBER.search(c) for c in cells[1:4]), (label, cells)
    assert rows["bare"][6] == "the reference"
    assert rows["muralist"][6] == "identical", "uncompiled, muralist run renders the bare processes' pixels"


def test_checkpoints_quick(runtime_env: dict[str, str], tiny_wan: Path) -> None:
    out = run_quick("checkpoints.py", runtime_env)
    rows = table_rows(out)
    assert [label.split(" (")[0] for label in rows] == ["plain", "straight", "preempted 3 times"], out[-2000:]
    assert_numbers(rows, 3)
    # At the quick mode's 40 steps a loaded machine can leave no measurable step time: then it says so.
    assert re.search(r"one step ([\d.]+ ms|not measured \(.*\)); one checkpoint written [\d.]+ ms", out), out[-2000:]
    assert "every item identical" in out
