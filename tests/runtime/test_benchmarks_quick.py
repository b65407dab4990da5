"""The benchmarks that have a quick mode run to their table (their figures are not checked:
timings on a shared machine mean nothing in a test)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

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
