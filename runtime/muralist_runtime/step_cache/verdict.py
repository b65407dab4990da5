"""What the cache gate (generation.cache.verify, gate.py) leaves in the job folder.

- Each sampled item's manifest row carries `cacheVerify`: {psnr, ssim} against its render
  without the cache (psnr null and `identical: true` when the two are the same pixels).
- `cache-off.json`, written when a sampled item missed a threshold with onFail: DisableCache:
  which item, what it measured, which threshold it missed. Every group reads it before each
  chunk and turns its cache off too, and a retried pod starts without the cache: the folder,
  which every pod shares, is how the verdict reaches the groups that did not measure it.
- the job file's `cacheVerify`: the summary of the rows, written at the merge (`summarise`).

cache-off.json is read and written through the job folder's storage (outputs/storage.py: a volume or
a bucket), which the gate and the merge pass in: the step cache sits below the outputs.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from muralist_api.contract.output_folder import CACHE_OFF_FILE

ROW_FIELD = "cacheVerify"


class FolderFiles(Protocol):
    """What the verdict needs of the job folder's storage (outputs/storage.py's `Storage`)."""

    def read_bytes(self, path: Path) -> bytes:
        """The file's bytes; FileNotFoundError when there is none."""
        ...

    def write(self, final: Path, data: bytes) -> None:
        """`data` as the whole file `final`, never seen partial."""
        ...


def write_off(files: FolderFiles, root: Path, verdict: dict[str, Any]) -> None:
    files.write(root / CACHE_OFF_FILE, (json.dumps(verdict, indent=2) + "\n").encode())


def read_off(files: FolderFiles, root: Path) -> dict[str, Any] | None:
    """The verdict that turned the cache off for this job, or None while it is on."""
    try:
        path = root / CACHE_OFF_FILE
        found = json.loads(files.read_bytes(path))  # the volume's file, or the bucket's object
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def row_measures(psnr: float, ssim: float) -> dict[str, Any]:
    """A sampled item's `cacheVerify` row field (JSON has no infinity: identical is said in words)."""
    if psnr == float("inf"):
        return {"psnr": None, "ssim": round(ssim, 6), "identical": True}
    return {"psnr": round(psnr, 3), "ssim": round(ssim, 6)}


def summarise(rows: Iterable[dict[str, Any]], thresholds: dict[str, float],
              off: dict[str, Any] | None) -> dict[str, Any]:
    """The job file's `cacheVerify` from the sampled rows: how many, min and mean PSNR (over the rows
    that differ) and SSIM, the thresholds and the verdict: passed (every sampled item met the
    thresholds), measured (no threshold), cacheDisabled (`off`: from which item). A failed
    verdict never reaches the merge: it is the job's failure (status.message, exit 78)."""
    measured = [r[ROW_FIELD] for r in rows if isinstance(r.get(ROW_FIELD), dict)]
    psnrs = [m["psnr"] for m in measured if m.get("psnr") is not None]
    ssims = [m["ssim"] for m in measured if m.get("ssim") is not None]
    verdict = "cacheDisabled" if off is not None else "passed" if thresholds else "measured"
    out: dict[str, Any] = {
        "sampled": len(measured),
        "identical": sum(1 for m in measured if m.get("identical")),
        "minPsnr": round(min(psnrs), 3) if psnrs else None,
        "meanPsnr": round(statistics.fmean(psnrs), 3) if psnrs else None,
        "minSsim": round(min(ssims), 6) if ssims else None,
        "meanSsim": round(statistics.fmean(ssims), 6) if ssims else None,
        "thresholds": thresholds,
        "verdict": verdict,
    }
    if off is not None:
        out["cacheDisabledFrom"] = off
    return out
