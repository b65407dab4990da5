"""A DiffusionJob's status for people: the lines of `muralist status`, the progress bar's counts and suffix.

Pure functions of the typed status (`muralist_api.status`), so a notebook can print the same text.
"""

from __future__ import annotations

from dataclasses import dataclass

from muralist_api.status import DiffusionJobStatus, Progress


@dataclass(frozen=True)
class BarState:
    """What the progress bar shows: `done` of `total` images (None while the pods have not said)
    and a suffix with the operator's rate, ETA and failed items."""

    done: int
    total: int | None
    suffix: str


def bar_state(progress: Progress) -> BarState:
    # The rate and ETA are the operator's (all pods over the last minute), not the bar's own
    # guess from how often the status changed, which jumps with every status write.
    return BarState(progress.completed + progress.failed, progress.total or None, rate_and_eta(progress))


def rate_and_eta(progress: Progress) -> str:
    """`2.31 img/s, ETA 2m44s, 3 failed`, each part when the operator has it ("no rate yet" before any)."""
    parts = []
    if progress.images_per_second is not None:
        parts.append(f"{progress.images_per_second:.2f} img/s")
    if progress.eta and progress.estimated_seconds_remaining != 0:  # nothing left: no ETA to show
        parts.append(f"ETA {progress.eta}")
    if progress.failed:
        parts.append(f"{progress.failed} failed")
    return ", ".join(parts) or "no rate yet"


def progress_line(progress: Progress) -> str:
    """`120/500 images (24.0%), 3 failed`; the total is unknown until the pods have read their rows."""
    done = progress.completed + progress.failed
    if not progress.total:
        return f"{done} images, total not known yet"
    percent = progress.percent if progress.percent is not None else 100.0 * done / progress.total
    failed = f", {progress.failed} failed" if progress.failed else ""
    return f"{progress.completed}/{progress.total} images ({percent:.1f}%){failed}"


def describe(name: str, status: DiffusionJobStatus) -> str:
    """`muralist status NAME`: phase, progress, rate and ETA, failed items and indexes, message."""
    progress = status.progress
    lines = [f"{name}: {status.phase}", f"  progress: {progress_line(progress)}"]
    if progress.images_per_second is not None or progress.eta:
        lines.append(f"  rate:     {rate_and_eta(progress)}")
    lines.append(f"  failed items: {progress.failed}")
    if status.indexes:
        lines.append(f"  failed indexes: {', '.join(str(e.index) for e in status.indexes)} "
                     f"({status.restarts} pod {'retry' if status.restarts == 1 else 'retries'})")
        lines.extend(f"    index {e.index}: {e.failures} x {e.last_failure_reason or 'failed'}"
                     + (f": {e.last_failure}" if e.last_failure else "") for e in status.indexes)
    if status.output_path:
        lines.append(f"  output: {status.output_path}")
    if status.message:
        lines.append(f"  message: {status.message}")
    return "\n".join(lines)
