"""The output folder: every name in it, and its job file (`JobRecord`), as the runtime writes them.

A job's folder (under spec.output.path on its volume, or spec.output.uri as objects) is read by
the runtime that resumes it, by the client (`muralist.results`) and by people; this module is the
one place that spells its names:

    images/<key>.<format>        layout files: an item's output (`item_file`)
    images/<key>.json            its record (`record_file`)
    images/<key>.<still>.jpg     the gallery's stills: a video's poster frame, an image-conditioned item's
                                 input and mask thumbnails (`still_file`, STILLS)
    shards/shard-<chunk>.tar     layout webdataset: members <key>.<format> + <key>.json per item (`shard_file`)
    parts/chunk-<chunk>.jsonl    the records of one finished chunk: its "done" marker (`part_file`)
    manifest.jsonl               every planned item's record, in item order (MANIFEST_FILE)
    index.parquet                the same as a Parquet table (INDEX_FILE)
    job.json                     the job file (JOB_FILE, `JobRecord`)
    index.html, gallery/         the gallery: page 1, then gallery/page-<n>.html and gallery/summary.js
    cache-off.json               the cache gate's verdict that turned the step cache off (CACHE_OFF_FILE)
    checkpoints/<key>.pt         runPolicy.checkpoint: an item's denoising state while it renders (`checkpoint_file`),
    checkpoints/<key>.json       and how far its last render got (`checkpoint_note_file`); removed once it is written

<chunk> is six digits, <n> five (more past their ranges); <key> is `<row>-<image>` (items.item_key).

`JobRecord` is job.json: what the job was (its name, the resolved runtime spec, the resume digest, the
output format and the folder's chunks), where it ran (library versions, the world) and, once merged,
what it made (the item counts by status, the cache gate's summary, a calibrated cache) and how long
each stage took (the timings, top-level numbers). Every field is optional: older versions wrote fewer
(muralist_api/contract/output_format.py, the one place that knows their shapes, reads a job file through
`output_format.read_job_record`), and a field a newer version adds is kept as it is.

Pure and torch-free.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass

JOB_FILE = "job.json"
MANIFEST_FILE = "manifest.jsonl"
INDEX_FILE = "index.parquet"
CACHE_OFF_FILE = "cache-off.json"
GALLERY_ENTRY = "index.html"  # the gallery's page 1, beside the outputs
GALLERY_DIR = "gallery"  # its other pages and its summary
GALLERY_SUMMARY = "summary.js"
IMAGES_DIR = "images"
SHARDS_DIR = "shards"
PARTS_DIR = "parts"
CHECKPOINTS_DIR = "checkpoints"
# The folder's directories, where its files (and so the temps they are written through) are.
DIRECTORIES = (IMAGES_DIR, SHARDS_DIR, PARTS_DIR, GALLERY_DIR, CHECKPOINTS_DIR)
# The stills the gallery shows beside an item's output (layout files): a video's first frame, the inputs.
STILLS = ("poster", "input", "mask")
RECORD_EXTENSION = "json"  # an item's record beside its output (layout files), and its shard member

_PART = re.compile(r"^chunk-(\d+)\.jsonl$")
_SHARD = re.compile(r"^shard-(\d+)\.tar$")
_PAGE = re.compile(r"^page-(\d+)\.html$")
_CHECKPOINT = re.compile(r"^(\d+-\d+)\.(?:pt|json)$")
CHECKPOINT_EXTENSION = "pt"  # torch.save's format (loaded back with weights_only: tensors and plain values)


def item_file(key: str, fmt: str) -> str:
    """An item's output in layout files, relative to the folder (its record's `file`)."""
    return f"{IMAGES_DIR}/{key}.{fmt}"


def record_file(key: str) -> str:
    """An item's record in layout files, relative to the folder."""
    return f"{IMAGES_DIR}/{key}.{RECORD_EXTENSION}"


def still_file(key: str, still: str) -> str:
    """One of an item's stills (STILLS), relative to the folder (its record's `poster`, `input`, `mask`)."""
    return f"{IMAGES_DIR}/{key}.{still}.jpg"


def member_name(key: str, extension: str) -> str:
    """A member of a shard: an item's output (`extension` its format) or its record."""
    return f"{key}.{extension}"


def shard_name(chunk: int) -> str:
    return f"shard-{chunk:06d}.tar"


def shard_file(chunk: int) -> str:
    """The shard of a chunk, relative to the folder (its items' `shard`)."""
    return f"{SHARDS_DIR}/{shard_name(chunk)}"


def shard_number(name: str) -> int | None:
    """The chunk a shard's file name (or its path in the folder) holds; None for another file."""
    match = _SHARD.match(name.rpartition("/")[2])
    return int(match[1]) if match else None


def part_name(chunk: int) -> str:
    return f"chunk-{chunk:06d}.jsonl"


def part_file(chunk: int) -> str:
    """The part file of a chunk, relative to the folder."""
    return f"{PARTS_DIR}/{part_name(chunk)}"


def part_number(name: str) -> int | None:
    """The chunk a part file's name says; None for another file (a temp, a stranger)."""
    match = _PART.match(name)
    return int(match[1]) if match else None


def checkpoint_file(key: str) -> str:
    """An item's checkpoint (runPolicy.checkpoint), relative to the folder: one object, written whole."""
    return f"{CHECKPOINTS_DIR}/{key}.{CHECKPOINT_EXTENSION}"


def checkpoint_note_file(key: str) -> str:
    """The note beside an item's checkpoint: the steps its last render reached (what a kill lost), relative to the
    folder."""
    return f"{CHECKPOINTS_DIR}/{key}.{RECORD_EXTENSION}"


def checkpoint_key(name: str) -> str | None:
    """The item a file of CHECKPOINTS_DIR is of (a checkpoint or its note); None for another file."""
    match = _CHECKPOINT.match(name)
    return match[1] if match else None


def page_name(number: int) -> str:
    """The file name of the gallery's page `number` >= 2 inside GALLERY_DIR (page 1 is GALLERY_ENTRY)."""
    return f"page-{number:05d}.html"


def page_number(name: str) -> int | None:
    """The page a file of GALLERY_DIR is; None for another file."""
    match = _PAGE.match(name)
    return int(match[1]) if match else None


@dataclass(frozen=True, config=ConfigDict(alias_generator=to_camel, populate_by_name=True))
class Chunks:
    """How a folder's rows are cut: chunk c is rows [first_row + c x chunk_rows, + chunk_rows).
    job.json's `plan`, from format 4 on."""

    first_row: Annotated[int, Field(strict=True, ge=0)]
    chunk_rows: Annotated[int, Field(strict=True, ge=1)]

    def to_json(self) -> dict[str, int]:
        return {"firstRow": self.first_row, "chunkRows": self.chunk_rows}


class JobRecord(BaseModel):
    """job.json. Fields in the order they are written; the timings follow them as top-level numbers
    (`loadSeconds`, ...: `timings`). Unknown fields are kept (a newer version's), never refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str | None = None
    namespace: str | None = None
    digest_version: Annotated[int | None, Field(strict=True)] = Field(
        None, description="Versions specDigest (contract/resume.py); format 1 before e831e2d left it out: version 1.")
    spec_digest: str | None = Field(None, description="The job-wide resume digest (contract/resume.py).")
    output_format: Annotated[int | None, Field(strict=True)] = Field(
        None, description="The folder's output format (contract/output_format.py); formats 1-3 left it out.")
    plan: Chunks | None = Field(None, description="The folder's chunks; formats 1-3 left them out.")
    spec: dict[str, Any] | None = Field(None, description="The resolved runtime spec (RuntimeSpec), as written: "
                                        "another version's may not read as this version's (`output`).")
    versions: dict[str, str] | None = Field(None, description="python, torch, diffusers, ...: 'absent' if missing.")
    world: dict[str, int] | None = Field(None, description="The world the first pod ran in (world size, groups, "
                                         "processes per node, ...).")
    cache_calibration: dict[str, Any] | None = Field(None, description="A calibrated step cache's ratios.")
    items: dict[str, int] | None = Field(None, description="The items by status, once merged (rendered, "
                                         "skipped, failed; rerendered).")
    cache_verify: dict[str, Any] | None = Field(None, description="The cache gate's summary, once merged.")
    checkpoints: dict[str, int] | None = Field(None, description="runPolicy.checkpoint, once merged: items resumed "
                                               "from a checkpoint (resumed), the steps they took from them "
                                               "(stepsSaved) and the steps rendered again after a stop (stepsLost).")
    memory: dict[str, Any] | None = Field(None, description="The layout's estimated peak per device "
                                          "(estimatedPeakMiB, its parts) beside each rank's measured peak "
                                          "(measuredPeakMiB by rank, measuredBy), once merged.")

    compile: dict[str, Any] | None = Field(None, description="generation.compile, once merged: each rank's "
                                           "compile record by rank (byRank: seconds, cacheHit, graphsCompiled, "
                                           "kernelsBuilt, each size's), and how many ranks found the compile "
                                           "cache holding their sizes (cacheHits of ranks).")

    @property
    def merged(self) -> bool:
        """Whether the job's outputs were merged (the record counts its items)."""
        return self.items is not None

    @property
    def timings(self) -> dict[str, float]:
        """The stages' durations (and peak memory): the record's top-level numbers that are no field."""
        return {k: v for k, v in (self.model_extra or {}).items()
                if isinstance(v, int | float) and not isinstance(v, bool)}

    @property
    def output(self) -> RecordedOutput:
        """spec.output as the job recorded it (the fields a reader of the folder needs)."""
        return _RecordedRuntimeSpec.model_validate(self.spec or {}).spec.output

    def to_text(self) -> str:
        """job.json's text: the fields set, in order, then the timings; two-space indented."""
        return json.dumps(self.model_dump(by_alias=True, mode="json", exclude_unset=True), indent=2) + "\n"


class _Recorded(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class RecordedOutput(_Recorded):
    """What a reader of the folder needs of the spec.output a job recorded."""

    format: str
    layout: str = "files"


class _RecordedJobSpec(_Recorded):
    output: RecordedOutput


class _RecordedRuntimeSpec(_Recorded):
    spec: _RecordedJobSpec
