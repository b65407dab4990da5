"""The GPU proof's CPU dry run (`hack/gpu-check.sh --dry-run`): every check it makes on a lent GPU,
at toy sizes on the CPU, so that the script cannot rot between the tasks that are lent one.

The dry run spawns `muralist run` three times (real launcher agents and torchrun) and compiles the toy
transformer twice on the CPU (cold, then from the compile cache): ~90 s on 2 idle cores, about 3 minutes on a
loaded one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from muralist_api.step_cache import CACHES

pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[2]
CHECKS = ["build", "render-path", "attention", "cache", "batching", "vae-tiling", "muralist-run", "per-item",
          "compile"]
BACKENDS = ["native", "_native_cudnn", "_native_flash", "flash", "sage"]
VERDICTS = {"ok", "FAIL", "n/a", "skipped (dry run)"}


def parse_table(text: str) -> list[dict[str, str]]:
    """The rows of the one Markdown table in `text` (cells unescaped)."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines and lines[0] == "| path | setting | figure | verdict |", text[-3000:]
    rows = []
    for line in lines[1:]:
        cells = [c.strip().replace("\0", "|") for c in line.strip("|").replace("\\|", "\0").split("|")]
        assert len(cells) == 4, line
        rows.append(dict(zip(("path", "setting", "figure", "verdict"), cells, strict=True)))
    return rows


def script_env() -> dict[str, str]:
    env = dict(os.environ)
    if sys.prefix != sys.base_prefix:
        env["MURALIST_VENV"] = sys.prefix  # the venv running these tests: reused as it is, no pip
    return env


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_dry_run_lists_every_check_and_passes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # The script's own hard limit for the dry run is 450 s (a killed run prints its rows and exits 1).
    proc = subprocess.run(["bash", "hack/gpu-check.sh", "--dry-run", "--out", str(out)], cwd=REPO, env=script_env(),
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.stdout.startswith("GPU check: CPU dry run"), proc.stdout[:500]
    rows = parse_table(proc.stdout)
    assert {r["path"] for r in rows} == set(CHECKS), "every check, by name, and nothing else"
    assert all(r["verdict"] in VERDICTS for r in rows), rows
    assert not [r for r in rows if r["verdict"] == "FAIL"], proc.stdout
    by_path = {name: [r for r in rows if r["path"] == name] for name in CHECKS}
    # Each backend has its row: native timed, the CUDA-only ones skipped, missing packages n/a.
    backends = {r["setting"]: r for r in by_path["attention"]}
    assert set(backends) == set(BACKENDS)
    assert backends["native"]["verdict"] == "ok" and "s/step" in backends["native"]["figure"]
    for name in ("_native_cudnn", "_native_flash"):
        assert backends[name]["verdict"] == "skipped (dry run)"
    for name in ("flash", "sage"):
        assert backends[name]["verdict"] in {"n/a", "skipped (dry run)"}
    # Every step cache the runtime offers, timed against uncached and compared by PSNR.
    caches = [r["setting"].split(":")[0] for r in by_path["cache"]]
    assert caches == ["none (4 steps)", *CACHES]
    assert all("PSNR vs uncached" in r["figure"] for r in by_path["cache"][1:])
    assert [r["setting"].split(" ")[1] for r in by_path["batching"][:4]] == ["1,", "2,", "4,", "8,"]
    assert "runtime / plain pipe() call" in [r["setting"] for r in by_path["render-path"]]
    runs = {r["setting"].split(":")[0]: r for r in by_path["muralist-run"]}
    assert set(runs) == {"DataParallel", "DeviceMap"}
    assert all(r["verdict"] == "ok" and r["figure"].startswith("exit 0; 4/4 PNGs") for r in runs.values())
    # Compile on the CPU: cold (the entry written), then as a new pod from the compile cache, and the step time.
    assert [r["setting"].split(":")[0] for r in by_path["compile"]] == ["off", "cold", "a new pod", "on"]
    cold, warm = by_path["compile"][1:3]
    assert "cache hit False" in cold["figure"] and "entry " in cold["figure"], cold
    assert "cache hit True; 0 graphs compiled, 0 kernels built" in warm["figure"], warm
    assert all(r["verdict"] == "ok" for r in by_path["compile"])
    (per_item,) = by_path["per-item"]
    assert per_item["verdict"] == "ok" and "ms/item" in per_item["figure"], per_item
    assert [r["verdict"] for r in by_path["vae-tiling"]] == ["skipped (dry run)"]
    # What --out keeps: the same table, the rows as they came, the run logs.
    assert parse_table((out / "gpu-check.md").read_text()) == rows
    saved = [json.loads(line) for line in (out / "gpu-check.jsonl").read_text().splitlines()]
    assert [(r["path"], r["verdict"]) for r in saved] == [(r["path"], r["verdict"]) for r in rows]
    assert {p.name for p in out.glob("muralist-run-*.log")} == {"muralist-run-DataParallel.log",
                                                                "muralist-run-DeviceMap.log",
                                                                "muralist-run-per-item.log"}


def test_a_failing_or_overlong_check_is_a_fail_row_and_the_others_still_run(tmp_path: Path) -> None:
    gpu_check = load_gpu_check()

    def slow(ctx, emit):
        emit(gpu_check.Row("slow", "before", "1", gpu_check.OK))
        time.sleep(30)

    def broken(ctx, emit):
        raise ValueError("no such thing\nsecond line")

    def fine(ctx, emit):
        emit(gpu_check.Row("fine", "x", "2", gpu_check.OK))

    sizes = gpu_check.dataclasses.replace(gpu_check.DRY, budget_s=60, boxes={"slow": 6})
    ctx = gpu_check.Context(sizes, tmp_path, None)
    original = gpu_check.CHECKS
    gpu_check.CHECKS = [gpu_check.Check("slow", slow), gpu_check.Check("broken", broken),
                        gpu_check.Check("fine", fine)]
    recorded = []
    try:
        start = time.monotonic()
        rows = gpu_check.run_checks(ctx, recorded.append)
    finally:
        gpu_check.CHECKS = original
    assert time.monotonic() - start < 15
    assert [(r.path, r.verdict) for r in rows] == [("slow", "ok"), ("slow", "FAIL"), ("broken", "FAIL"),
                                                   ("fine", "ok")]
    assert "time box" in rows[1].figure
    assert rows[2].figure == "ValueError: no such thing"
    assert recorded == rows


def test_killed_run_prints_its_rows_and_fails(tmp_path: Path) -> None:
    rows = tmp_path / "gpu-check.jsonl"
    rows.write_text(json.dumps({"path": "build", "setting": "s", "figure": "f", "verdict": "ok"}) + "\n")
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--table", str(rows), "--killed-after", "450"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    table = parse_table(proc.stdout)
    assert [(r["path"], r["verdict"]) for r in table] == [("build", "ok"), ("gpu-check", "FAIL")]
    assert "killed after 450 s" in table[1]["figure"]


def test_without_cuda_the_gpu_run_refuses(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the GPU run would start")
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--dry-run" in proc.stderr
