"""A chunk's part file: the manifest lines of one chunk, written once all its items are on disk or failed (its
"done" marker), read back on resume and by the merge, and the chunks of a folder being resumed (the output
folder's recorded cut, or for an older folder its first part files'). Folders of older versions are read through
muralist_api/contract/output_format.py, never around it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from muralist_api.contract import PermanentFailure, output_folder, output_format
from muralist_api.contract.output_folder import JobRecord
from muralist_api.runtime_spec import RuntimeSpec

from ..work.chunks import ChunkCounts
from ..work.item_failures import NAMED, describe_item
from . import storage
from .writer import atomic_write_text


def part_path(root: Path, chunk: int) -> Path:
    return root / output_folder.part_file(chunk)


def read_part(root: Path, chunk: int) -> list[dict[str, Any]] | None:
    """The entries of a finished chunk (in today's shape, whichever version wrote them), or None
    when it is not finished (or cannot be read now). A part file is renamed into place whole, so one
    that does not read as entries was not written by a version this runtime knows: the folder is refused."""
    try:
        return load_part(root, chunk)
    except OSError:
        return None


def load_part(root: Path, chunk: int) -> list[dict[str, Any]]:
    """read_part, raising FileNotFoundError for a chunk not finished and OSError for one that cannot be
    read now (the merge tells the two apart)."""
    path = part_path(root, chunk)
    text = storage.at(path).read_bytes(path).decode()
    out = []
    try:
        for number, line in enumerate(text.splitlines(), 1):
            try:
                raw = json.loads(line)
            except ValueError:
                raise output_format.FormatError(f"line {number} is not JSON") from None
            out.append(output_format.read_entry(raw))
        if not out:
            raise output_format.FormatError("lists no item")
    except output_format.FormatError as e:
        where = storage.at(path).where(path)
        raise PermanentFailure("spec.output.path", f"{where} is not a part file this version reads ({e}); move it "
                               f"away to render chunk {chunk} again, or use another output.path") from None
    return out


def resumed_plan(runtime: RuntimeSpec, plan: Any, recorded: JobRecord | None) -> Any:
    """The work plan (work.WorkPlan) of a run on this output folder: cut in the folder's chunks,
    recorded in its job file or, for a folder of format 2-3, read off its first part files."""
    root = Path(runtime.output_dir)
    fresh = output_format.Chunks(plan.start, plan.chunk_rows)
    try:
        folder = output_format.recorded_chunks(recorded) if recorded is not None else None
        if folder is None:
            rows = output_format.infer_chunk_rows(_first_parts_rows(root), plan.start, plan.rows)
            folder = output_format.Chunks(plan.start, rows) if rows is not None else None
    except output_format.FormatError as e:
        raise PermanentFailure("spec.output.path", f"{root} {e}; use another output.path") from None
    chunks = output_format.resume_chunks(folder, fresh, runtime.spec.output.layout, str(root))
    return replace(plan, chunk_rows=chunks.chunk_rows)


def _first_parts_rows(root: Path) -> dict[int, set[int]]:
    """chunk -> the rows its part file lists, of the two lowest-numbered part files: enough to
    tell the chunk size (chunk 0 alone may be the last one)."""
    numbers = sorted(n for name in storage.at(root).names(root / output_folder.PARTS_DIR)
                     if (n := output_folder.part_number(name)) is not None)
    out = {}
    for chunk in numbers[:2]:
        entries = read_part(root, chunk)
        if entries:
            out[chunk] = {e["promptIndex"] for e in entries}
    return out


def chunk_counts(entries: list[dict[str, Any]]) -> ChunkCounts:
    """A finished chunk's completed items, failed items, and the first failed ones described."""
    failed = [e for e in entries if e.get("status") == "failed"]
    return len(entries) - len(failed), len(failed), [describe_item(e.get("key", "?"), e.get("id"), e.get("error"))
                                                     for e in failed[:NAMED]]


def write_part(root: Path, chunk: int, entries: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(part_path(root, chunk), "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
