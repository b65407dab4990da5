#!/usr/bin/env python3
"""Memory and latency of `muralist_runtime.work.sources.RowSource` on a 1,000,000-row data set.

    ~/.cache/muralist/venv/bin/python benchmarks/dataset_scale.py [--rows 1000000] [--chunk 1000]

Builds, in a temp dir, the same prompts ("a photo of item N", seed N) as JSON Lines and as
Parquet twice: written by `pyarrow.parquet.write_table` with its default row-group size (1 Mi
rows: the whole file is one row group) and with 64 Ki-row groups. Plus 10-row copies of each.
Then, in a fresh subprocess per case (so no case inherits another's heap or caches), a rank's
view of one claim: open the source, take the first row of a chunk of `--chunk` rows at the
start or near the end of the data set (the time a rank waits for its first item), read the rest
of the chunk, and count the whole source. Peak RSS growth is the peak after all of that minus
the peak once the modules are imported, compared with the same case on the 10-row data set.
The peak is VmHWM from /proc/self/status, not getrusage's ru_maxrss: Linux carries ru_maxrss
over fork and exec, so a child reports its parent's peak (here the parent that built the table).

Targets: peak memory growth < 200 MB over the 10-row case, first row < 10 s. The files are
read from the page cache (they were just written): a cold network volume adds its read time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GROWTH_TARGET_MB = 200
FIRST_ROW_TARGET_S = 10.0


def build(directory: Path, rows: int) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    jsonl = directory / "prompts.jsonl"
    with open(jsonl, "w") as f:
        for i in range(rows):
            f.write(f'{{"prompt": "a photo of item {i}", "seed": {i}}}\n')
    table = pa.table({"prompt": [f"a photo of item {i}" for i in range(rows)], "seed": pa.array(range(rows))})
    pq.write_table(table, directory / "default.parquet")
    pq.write_table(table, directory / "groups.parquet", row_group_size=64 * 1024)
    return {"jsonl": jsonl, "parquet (default groups)": directory / "default.parquet",
            "parquet (64 Ki-row groups)": directory / "groups.parquet"}


def peak_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child(path: str, begin: int, end: int) -> None:
    """One case, in its own process; prints a JSON line of measurements."""
    import pyarrow.parquet  # noqa: F401 - imported before the baseline, like a rank that has it loaded
    from muralist_runtime.work.sources import Columns, RowSource

    base_kb = peak_rss_kb()
    t0 = time.perf_counter()
    source = RowSource(path, columns=Columns(seed="seed"))
    t_open = time.perf_counter() - t0
    rows = source.rows(begin, end)
    first = next(rows)
    t_first = time.perf_counter() - t0
    n = 1 + sum(1 for _ in rows)
    t_chunk = time.perf_counter() - t0
    t1 = time.perf_counter()
    total = source.count()
    t_count = time.perf_counter() - t1
    assert first.index == begin and first.seed == begin and first.ok, first
    peak_kb = peak_rss_kb()
    print(json.dumps({"open_s": t_open, "first_s": t_first, "chunk_s": t_chunk, "count_s": t_count, "rows": n,
                      "total": total, "growth_mb": (peak_kb - base_kb) / 1024, "peak_mb": peak_kb / 1024}))


def run_case(path: Path, begin: int, end: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(path), str(begin), str(end)],
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--child", nargs=3, metavar=("PATH", "BEGIN", "END"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return 0

    with tempfile.TemporaryDirectory(prefix="muralist-bench-") as tmp:
        t = time.perf_counter()
        big = build(Path(tmp) / "big", args.rows)
        small = build(Path(tmp) / "small", 10)
        sizes = {name: path.stat().st_size / 1e6 for name, path in big.items()}
        print(f"built {args.rows:,} rows in {time.perf_counter() - t:.1f} s: "
              + ", ".join(f"{k} {v:.0f} MB" for k, v in sizes.items()), file=sys.stderr, flush=True)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        lines = [f"{args.rows:,} rows, chunks of {args.chunk:,}; load average {load}",
                 "",
                 "| source | chunk at | open s | first row s | chunk s | count s | peak RSS MB | growth MB | "
                 "growth over 10-row MB |",
                 "|---|---|---|---|---|---|---|---|---|"]
        ok = True
        for name in big:
            for where, begin in (("start", 0), ("end", args.rows - args.chunk)):
                r = run_case(big[name], begin, begin + args.chunk)
                s = run_case(small[name], 0 if where == "start" else 10 - min(10, args.chunk), 10)
                over = r["growth_mb"] - s["growth_mb"]
                ok &= over < GROWTH_TARGET_MB and r["first_s"] < FIRST_ROW_TARGET_S and r["total"] == args.rows
                lines.append(f"| {name} | {where} ({begin:,}) | {r['open_s']:.3f} | {r['first_s']:.3f} | "
                             f"{r['chunk_s']:.3f} | {r['count_s']:.3f} | {r['peak_mb']:.0f} | {r['growth_mb']:.1f} | "
                             f"{over:.1f} |")
        lines += ["", f"targets (growth over 10-row < {GROWTH_TARGET_MB} MB, first row < {FIRST_ROW_TARGET_S:g} s): "
                  + ("met" if ok else "MISSED")]
        print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
