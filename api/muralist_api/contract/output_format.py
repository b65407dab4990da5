"""The output format: a contract across versions, what each version wrote, how it is read.

A job's output folder outlives the runtime that started it: a pod upgraded in the middle of a
job, or the same manifest run again by a newer `muralist`, resumes a folder an older version
wrote. So the folder's layout (its names: contract/output_folder.py) is versioned (`OUTPUT_FORMAT`,
recorded in the job file as `outputFormat`, beside `digestVersion`, which versions the resume digest:
muralist_api/contract/resume.py), and this module is the one place that knows the shapes older versions
wrote.

Versions (tests/fixtures/formats/ holds a partial folder of each, written by the commit named):

1. 2a8e806 .. a4144e8^: layout files only: images/<key>.<format> + <key>.json, the JSON without
   `index`, `id` and `kind`; manifest.rank-<r>.jsonl; no part files; a job file without
   `outputFormat` (and before e831e2d without `digestVersion`: digest version 1).
2. a4144e8 ..: parts/chunk-<c>.jsonl marks chunk c finished and lists its items; chunks of
   ceil(rows / (4 x data-parallel groups)) rows (at most 32), or shardSize rows with layout
   webdataset (shards/shard-<c>.tar); the Parquet index; items' JSON gains index, id and kind.
3. 4acd534 ..: chunks of ceil(rows / (16 x groups)) rows: the same part file names cover other
   rows. Fields added since (video frames, fps and codec, poster and input thumbnails,
   adapters, scheduler, cache, the cache gate's cacheVerify) are optional and change nothing
   for a reader; so are the job file's cacheVerify and cacheCalibration and the folder's
   cache-off.json.
4. 7266f35 ..: the job file records `outputFormat` and the folder's chunks, `plan: {firstRow,
   chunkRows}`: a resume keeps the folder's chunks whatever the world size or this version's
   chunking. Fields added since, optional for a reader: an item's `requestDigest` and `inputs`
   (the request it was made for: contract/resume.py) and `replaced` (what changed when it was made
   again); the job file's `items.rerendered`. A record without a request digest is an older version's:
   resume.py says when it is kept (the job-wide digest, then what the record names). A resume lists
   the items it kept with status "skipped" in their chunk's part file (the entries otherwise as they
   were).
   Also optional for a reader (runPolicy.checkpoint): an item's `resumedFromStep`, `stepsSaved` and
   `stepsLost`, the job file's `checkpoints`, and the folder's checkpoints/ (an item's state while it
   renders; a runtime that does not read it renders the item from its first step).

This runtime resumes every version from 1 to OUTPUT_FORMAT. How older ones are read:
- `read_entry`: an item's JSON or a part file's line of any version, as today's entry (the
  index its file name gives, promptIndex and imageIndex from its key, `id` None, `kind` "image");
- the chunks of a folder that did not record them (1-3): `infer_chunk_rows` reads them off its
  part files (a part file lists every item of its chunk); a folder without part files (1) has
  none to keep, and its items are kept one by one, by their files.
- the job file of any version: `read_job_record`, as today's `JobRecord` (contract/output_folder.py, where
  every name of the folder is spelled): its fields are optional, as older versions wrote fewer.
A folder it cannot read is refused (`FormatError`, which the runtime turns into exit 78 naming
spec.output.path and what changed): one of a newer version (`NewerFormat`), a part file or a job file
that is not one. Between
the runtime images the skew policy pairs (contract/versions.py: releases N and N-1 under one
operator) that makes resuming one-way: N resumes a folder of N-1, N-1 refuses one that N wrote
in a newer format.

The rule for changing the format:
- Bump OUTPUT_FORMAT when a reader of the current version would misread a folder the new code
  writes: a field renamed, removed or given another meaning, a file moved or renamed, another
  chunking, a new file a resume must read. Adding an optional field that readers may ignore
  is no change.
- The new runtime resumes every older version: teach `read_entry` (or the plan) the old shape
  here and describe the new version above. Then, from the commit that introduces it, freeze a
  partial folder of each layout (add it to tests/fixtures/formats/make_fixtures.py and run
  that); tests/runtime/test_runtime_formats.py resumes every frozen folder, so each later
  change is tested against every format before it. What cannot be resumed is refused with exit
  78 naming spec.output.path and what changed: never a traceback, never a retryable error (a
  pod upgraded mid-job would crash-loop until maxRestarts).

Pure and torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError

from muralist_api.contract import PermanentFailure
from muralist_api.contract.output_folder import Chunks, JobRecord, part_file

__all__ = ["OLDEST_FORMAT", "OUTPUT_FORMAT", "Chunks", "FormatError", "NewerFormat", "infer_chunk_rows", "read_entry",
           "read_job_record", "recorded_chunks", "recorded_format", "resume_chunks"]

OUTPUT_FORMAT = 4
OLDEST_FORMAT = 1
_KEY = re.compile(r"(\d+)-(\d+)")  # <row>-<image> (muralist_api/items.item_key), in every version


class FormatError(ValueError):
    """A folder this runtime cannot resume; the message says what in it is not understood."""


class NewerFormat(FormatError):
    """A folder of an output format a newer version wrote: that version resumes it."""


# What a job file's field that does not read says (the default: a value of a type no version writes).
_UNREADABLE = {"plan": "records a plan {value!r}, not {{firstRow: >= 0, chunkRows: >= 1}}"}


def read_job_record(raw: Any) -> JobRecord:
    """A job file's JSON (parsed) as today's JobRecord, whichever version wrote it; FormatError when none
    did (not a JSON object, a field of a type no version writes), NewerFormat for a newer version's."""
    if not isinstance(raw, Mapping):
        raise FormatError(f"is not a job file of Muralist (not a JSON object but {type(raw).__name__})")
    try:
        record = JobRecord.model_validate(raw)
    except ValidationError as e:
        name = str(e.errors()[0]["loc"][0])
        why = _UNREADABLE.get(name, "records {name} {value!r}, which no Muralist version writes")
        raise FormatError(why.format(name=name, value=raw.get(name))) from None
    recorded_format(record)
    return record


def recorded_format(record: JobRecord) -> int | None:
    """The folder's output format by its job file; None for versions 1-3, which did not record it."""
    value = record.output_format
    if value is None:
        return None
    if value < OLDEST_FORMAT:
        raise FormatError(f"records outputFormat {value!r}, which no Muralist version writes")
    if value > OUTPUT_FORMAT:
        raise NewerFormat(f"was written in output format {value} by a newer Muralist version; this one writes "
                          f"format {OUTPUT_FORMAT} and resumes formats {OLDEST_FORMAT}-{OUTPUT_FORMAT}")
    return value


def read_entry(raw: Any, key: str | None = None, index: int | None = None) -> dict[str, Any]:
    """One item's entry, in today's shape, from any version's: a part file's line, or (with the
    `key` and `index` its file name gives) an item's JSON file."""
    if not isinstance(raw, dict):
        raise FormatError(f"an item entry is a JSON object, not {type(raw).__name__}")
    entry = dict(raw)
    if key is not None:
        entry.setdefault("key", key)
    if not isinstance(entry.get("key"), str) or not (match := _KEY.fullmatch(entry["key"])):
        raise FormatError(f"an item entry has a key <row>-<image>, not {entry.get('key')!r}")
    if key is not None and entry["key"] != key:
        raise FormatError(f"the entry of item {key} names item {entry['key']}")
    entry.setdefault("promptIndex", int(match[1]))
    entry.setdefault("imageIndex", int(match[2]))
    if "index" not in entry:
        if index is None:  # only version 1 left it out, and version 1 wrote no part files
            raise FormatError(f"item {entry['key']} has no index")
        entry["index"] = index
    for name in ("index", "promptIndex", "imageIndex"):
        if not isinstance(entry[name], int) or isinstance(entry[name], bool):
            raise FormatError(f"item {entry['key']} has {name} {entry[name]!r}, not a number")
    entry.setdefault("id", None)
    entry.setdefault("kind", "image")
    return entry


def recorded_chunks(record: JobRecord) -> Chunks | None:
    """The chunks a folder of version 4 or later recorded (its job file's `plan`, checked as it was
    read); None when it recorded none."""
    return record.plan


def infer_chunk_rows(parts: Mapping[int, Collection[int]], first_row: int, rows: int) -> int | None:
    """The chunk size of a folder that did not record it (versions 2-3), from the rows its part
    files list (chunk -> rows): a part file lists every item of its chunk. None without any."""
    sizes = set()
    for chunk, listed in sorted(parts.items()):
        low, high = min(listed), max(listed)
        if chunk == 0:
            size = high - first_row + 1
            fits = low == first_row
            if high >= first_row + rows - 1:
                size = max(size, rows)  # chunk 0 was the whole job: one chunk still
        else:
            size, rest = divmod(low - first_row, chunk)
            fits = rest == 0 and size >= 1 and high < low + size
        if not fits:
            raise FormatError(f"has {part_file(chunk)} listing rows {low}-{high}, which is no chunk of "
                              f"rows counted from row {first_row}")
        sizes.add(size)
    if len(sizes) > 1:
        raise FormatError(f"has part files of chunks of {' and '.join(map(str, sorted(sizes)))} rows")
    return sizes.pop() if sizes else None


def resume_chunks(folder: Chunks | None, fresh: Chunks, layout: str, where: str) -> Chunks:
    """The chunks a run on a folder uses: the folder's own (a part file names a chunk of them), or
    `fresh` (this run's own cut) for a new folder. A webdataset folder of other shards, or of
    rows counted from another first row, is refused naming the field that moved."""
    if folder is None or folder == fresh:
        return fresh
    if folder.first_row != fresh.first_row:
        raise PermanentFailure("spec.dataset.start", f"{where} holds chunks counted from row {folder.first_row}, "
                               f"this job starts at row {fresh.first_row}; set start {folder.first_row} to resume "
                               "it, or use another output.path")
    if layout == "webdataset":
        raise PermanentFailure("spec.output.shardSize", f"{where} holds shards of {folder.chunk_rows} rows, this job "
                               f"asks for {fresh.chunk_rows}; set shardSize {folder.chunk_rows} to resume it, or use "
                               "another output.path")
    return folder
