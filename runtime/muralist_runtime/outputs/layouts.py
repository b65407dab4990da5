"""Where items go: the two output layouts, and the chunk part files that say what is done.

Layout under the output directory (spec.output.layout; every name is the output-folder contract's,
muralist_api/contract/output_folder.py):

    files:       images/<key>.<format> and images/<key>.json (metadata first, image last: an
                 image on disk means its metadata is there too); a video's poster frame
                 images/<key>.poster.jpg, and image-conditioned items' input thumbnails
                 images/<key>.input.jpg / .mask.jpg, for the gallery (written before the output)
    webdataset:  shards/shard-<chunk>.tar, members <key>.<format> + <key>.json per item
    both:        parts/chunk-<chunk>.jsonl, the manifest lines of one chunk, written once all
                 its items are on disk or failed: a chunk's part file is its "done" marker;
                 the manifest, the index, the job file and the gallery (merge.py, at the end)

Every file is written to a temp name and renamed, so no reader sees a partial one; a rank
killed mid-chunk costs that chunk's unfinished items (files) or its shard (webdataset).
Folders of older versions are read through muralist_api/contract/output_format.py (here by
`read_part`, `kept` and `resumed_plan`): that module is the format's contract, and this one never
reads around it.
Encoding happens on writer threads (writer.BackgroundWriter): `FilesLayout.write` writes an
item's files there; `WebDatasetLayout.write` only encodes, and the generating thread adds the
members to the shard in item order (`add`), so a shard's bytes do not depend on thread timing.
"""

from __future__ import annotations

import io
import json
import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from muralist_api.contract import PermanentFailure, output_folder, output_format
from muralist_api.contract.output_folder import JobRecord
from muralist_api.items import Item, printable
from muralist_api.runtime_spec import RuntimeSpec

from ..work.chunks import ChunkCounts
from ..work.item_failures import NAMED, describe_item
from . import media, requests, shards, storage, temps
from .thumbnails import thumbnail_jpeg
from .writer import atomic_write_bytes, atomic_write_text

log = logging.getLogger("muralist")

PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
# Deterministic fields only: the PNG bytes then depend on the pixels alone, so the same job
# gives byte-identical files on any world size (rank and seconds live in the JSON).
PNG_TEXT_FIELDS = ("prompt", "negativePrompt", "seed", "steps", "guidanceScale", "height",
                   "width", "model", "revision", "dtype")


@dataclass
class RenderedOutput:
    """One item's result on its way to the writer threads: an image or a video, and its inputs."""

    image: Any = None  # a PIL image (image pipelines)
    frames: Any = None  # a (frames, height, width, 3) uint8 array (video pipelines)
    inputs: dict[str, Any] = field(default_factory=dict)  # "image" / "mask" -> PIL, for the thumbnails
    # More fields for the item's metadata (the cache gate's measurements); None removes one.
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def is_video(self) -> bool:
        return self.frames is not None

    def pixels(self) -> Any:
        """The 8-bit pixels as int16, (H, W, 3) or (T, H, W, 3): what the canary compares."""
        import numpy as np

        if self.is_video:
            return np.asarray(self.frames, dtype=np.int16)
        return np.asarray(self.image.convert("RGB"), dtype=np.int16)


def tree(root: Path) -> list[Path]:
    """The output tree's directories: where its files, and so their temps, are (never the folders
    beside it: with output.path "." those are other jobs')."""
    return [root, *(root / directory for directory in output_folder.DIRECTORIES)]


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


def metadata(runtime: RuntimeSpec, item: Item, rank: int, seconds: float) -> dict[str, Any]:
    spec = runtime.spec
    gen = spec.generation
    shape = item.shape(gen)
    meta = {
        "key": item.key,
        "index": item.number(gen.images_per_prompt),
        "promptIndex": item.row,
        "imageIndex": item.image_index,
        "id": item.id,
        "prompt": item.prompt,
        "negativePrompt": item.negative_prompt,
        "seed": item.seed,
        "steps": gen.steps,
        "guidanceScale": gen.guidance_scale,
        "height": shape.height,
        "width": shape.width,
        "model": spec.model.name,
        "revision": spec.model.revision,
        "dtype": spec.model.dtype,
        "rank": rank,
        "seconds": round(seconds, 4),
        "kind": "image",
    }
    if isinstance(item.image, str):
        meta["inputImage"] = item.image
    if isinstance(item.mask, str):
        meta["inputMask"] = item.mask
    if item.strength is not None:
        meta["strength"] = item.strength
    if gen.scheduler is not None:
        meta["scheduler"] = gen.scheduler.name
    if gen.cache is not None:
        meta["cache"] = gen.cache.type
    if spec.model.adapters:
        meta["adapters"] = [{"name": a.name, "scale": a.scale} for a in spec.model.adapters]
    return meta


def output_metadata(runtime: RuntimeSpec, item: Item, rank: int, seconds: float,
                    output: RenderedOutput) -> dict[str, Any]:
    """`metadata` with the output's own fields, and for a video its kind, frame count, fps and encoding
    (media.video_info)."""
    meta = metadata(runtime, item, rank, seconds)
    for name, value in output.metadata.items():
        if value is None:
            meta.pop(name, None)
        else:
            meta[name] = value
    if output.is_video:
        fmt = runtime.spec.output.format
        meta.update(kind="video", frames=len(output.frames), fps=runtime.spec.generation.fps, **media.video_info(fmt))
    return meta


def encode_output(output: RenderedOutput, runtime: RuntimeSpec, meta: dict[str, Any]) -> bytes:
    fmt = runtime.spec.output.format
    if output.is_video:
        return media.encode_video(output.frames, runtime.spec.generation.fps, fmt)
    return encode_image(output.image, fmt, meta)


def integrity(data: bytes) -> dict[str, Any]:
    """What an item's record says of its output file, to tell it from one cut short: its size and CRC-32."""
    return {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}


def failed_entry(runtime: RuntimeSpec, item: Item, rank: int, reason: str) -> dict[str, Any]:
    entry = metadata(runtime, item, rank, 0.0)
    entry.update(status="failed", error=reason)
    return entry


def encode_image(image: Any, fmt: str, meta: dict[str, Any]) -> bytes:
    """A PIL image as PNG (with the deterministic metadata as text chunks), JPEG or WebP."""
    buf = io.BytesIO()
    kwargs: dict[str, Any] = {}
    if fmt == "png":
        from PIL.PngImagePlugin import PngInfo

        info = PngInfo()
        for name in PNG_TEXT_FIELDS:
            if meta.get(name) is not None:
                info.add_text(name, printable(str(meta[name])))  # a text chunk is UTF-8 (or Latin-1): no surrogates
        kwargs["pnginfo"] = info
    else:
        kwargs["quality"] = 95
    image.save(buf, format=PIL_FORMATS[fmt], **kwargs)
    return buf.getvalue()


@dataclass
class Kept:
    """What a chunk's items on disk are: kept (made for this request: their entries, status "skipped"), or
    stale (made for another request: what changed; they are rendered again, their files replaced)."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    stale: dict[str, list[str]] = field(default_factory=dict)


def keep(runtime: RuntimeSpec, trust: requests.FolderTrust, item: Item, entry: dict[str, Any], kept: Kept) -> None:
    """Sort an item's entry on disk into `kept`: kept as "skipped" (with the item's id of now), or stale."""
    why = requests.changed(runtime, item, entry, trust)
    if why is not None:
        kept.stale[item.key] = why
        return
    kept.entries[item.key] = relisted(entry, item)


def relisted(entry: dict[str, Any], item: Item) -> dict[str, Any]:
    """An entry on disk as this run lists it: kept ("skipped"), with the item's id of now; what an earlier
    run replaced is that run's to say."""
    out = {**entry, "status": "skipped", "id": item.id}
    out.pop("replaced", None)
    return out


class FilesLayout:
    """images/<key>.<format> + images/<key>.json per item."""

    name = "files"

    def __init__(self, runtime: RuntimeSpec, rank: int, trust: requests.FolderTrust = requests.TRUSTED):
        self.runtime, self.rank, self.trust = runtime, rank, trust
        self.root = Path(runtime.output_dir)
        self.images = self.root / output_folder.IMAGES_DIR
        self.ext = runtime.spec.output.format
        self._unsynced: dict[int, list[Path]] = {}  # by chunk: the files its part file will name, not fsynced

    def prepare(self) -> None:
        self.images.mkdir(parents=True, exist_ok=True)
        (self.root / output_folder.PARTS_DIR).mkdir(parents=True, exist_ok=True)
        temps.remove_stale_in(tree(self.root))

    def image_path(self, item: Item) -> Path:
        return self.root / output_folder.item_file(item.key, self.ext)

    def meta_path(self, item: Item) -> Path:
        return self.root / output_folder.record_file(item.key)

    def item_done(self, item: Item) -> bool:
        # The output is written last: its presence says the metadata is there too.
        files = storage.at(self.root)
        return files.exists(self.image_path(item)) and files.exists(self.meta_path(item))

    def kept(self, chunk: int, items: list[Item]) -> Kept:
        """This chunk's items already on disk (from an earlier attempt, a duplicate, or an earlier version:
        output_format.read_entry), kept when made for this request, else stale; an item whose JSON does not
        read is rendered again."""
        out = Kept()
        per_row = self.runtime.spec.generation.images_per_prompt
        for item in items:
            if not self.item_done(item):
                continue
            try:
                raw = json.loads(storage.at(self.root).read_bytes(self.meta_path(item)))
                entry = output_format.read_entry(raw, item.key, item.number(per_row))
            except (OSError, ValueError):  # output_format.FormatError is a ValueError
                continue
            if not self._intact(item, entry):
                continue
            keep(self.runtime, self.trust, item, entry, out)
        return out

    def _intact(self, item: Item, entry: dict[str, Any]) -> bool:
        """Whether the output on disk is the one its record describes (its size and CRC-32; a record of an
        earlier version has neither, and its output was fsynced). Files are fsynced only when their chunk
        ends (end_chunk), so a machine that crashed before could leave an output cut short or empty."""
        if "bytes" not in entry:
            return True
        try:
            data = storage.at(self.root).read_bytes(self.image_path(item))
        except OSError:
            return False
        if integrity(data) == {"bytes": entry.get("bytes"), "crc32": entry.get("crc32")}:
            return True
        log.warning("item %s: %s is not the output its record describes (%d bytes, not %s: a write cut short); "
                    "rendering it again", item.key, output_folder.item_file(item.key, self.ext), len(data),
                    entry.get("bytes"))
        return False

    def begin_chunk(self, chunk: int, kept: dict[str, dict[str, Any]]) -> None:
        # Kept items are named by this chunk's part file too: an earlier pod may have left them unsynced.
        self._unsynced[chunk] = [path for key in kept for path in (self.root / output_folder.record_file(key),
                                                                   self.root / kept[key]["file"])]

    def write(self, chunk: int, item: Item, output: RenderedOutput, seconds: float) -> dict[str, Any]:
        """On a writer thread: metadata first, then the gallery's stills, the output last, each atomically.
        An item made for another request before (`replaced`) loses its old output first: never the new
        metadata beside the old picture."""
        meta = output_metadata(self.runtime, item, self.rank, seconds, output)
        if meta.get("replaced"):
            storage.at(self.image_path(item)).remove(self.image_path(item))
        meta["file"] = output_folder.item_file(item.key, self.ext)
        stills: dict[str, Any] = {}
        if output.is_video:
            stills["poster"] = media.poster_frame(output.frames)
        for field_name, image in output.inputs.items():
            stills["input" if field_name == "image" else field_name] = image
        for name in stills:
            meta[name] = output_folder.still_file(item.key, name)
        data = encode_output(output, self.runtime, meta)
        meta.update(integrity(data))
        written = [self.meta_path(item), *(self.root / meta[name] for name in stills), self.image_path(item)]
        # Not fsynced one by one (two journal commits an item): end_chunk makes them durable before the part
        # file names them, and `kept` checks an output against its record.
        atomic_write_text(written[0], json.dumps(meta, indent=2) + "\n", fsync=False)
        for path, (name, image) in zip(written[1:-1], stills.items(), strict=True):
            still = encode_image(image, "jpeg", meta) if name == "poster" else thumbnail_jpeg(image)
            atomic_write_bytes(path, still, fsync=False)
        atomic_write_bytes(written[-1], data, fsync=False)
        self._unsynced.setdefault(chunk, []).extend(written)
        meta["status"] = "rendered"
        return meta

    def add(self, chunk: int, item: Item, result: dict[str, Any]) -> dict[str, Any]:
        return result  # already on disk

    def end_chunk(self, chunk: int) -> None:
        storage.at(self.root).make_durable(self._unsynced.pop(chunk, []))

    def abandon_chunk(self, chunk: int) -> None:
        """A drained rank leaves the chunk unfinished: its written items stay (and are kept by the
        next rank that takes the chunk, which checks them and makes them durable)."""
        self._unsynced.pop(chunk, None)


class WebDatasetLayout:
    """shards/shard-<chunk>.tar: one shard per chunk, written by the rank that claimed it."""

    name = "webdataset"

    def __init__(self, runtime: RuntimeSpec, rank: int, trust: requests.FolderTrust = requests.TRUSTED):
        self.runtime, self.rank, self.trust = runtime, rank, trust
        self.root = Path(runtime.output_dir)
        self.shards = self.root / output_folder.SHARDS_DIR
        self.ext = runtime.spec.output.format
        self._open: dict[int, shards.ShardWriter] = {}

    def prepare(self) -> None:
        self.shards.mkdir(parents=True, exist_ok=True)
        (self.root / output_folder.PARTS_DIR).mkdir(parents=True, exist_ok=True)
        temps.remove_stale_in(tree(self.root))

    def item_done(self, item: Item) -> bool:
        return False  # a shard is all or nothing: items are never done on their own

    def kept(self, chunk: int, items: list[Item]) -> Kept:
        """Items a finished shard of this chunk already holds for this request (the shard is written again
        with them, and the failed and stale ones rendered again)."""
        out = Kept()
        path = shards.shard_path(self.shards, chunk)
        if not storage.at(path).exists(path):
            return out
        entries = {e["key"]: e for e in read_part(self.root, chunk) or [] if e.get("status") != "failed"}
        for item in items:
            if item.key in entries:
                keep(self.runtime, self.trust, item, entries[item.key], out)
        return out

    def begin_chunk(self, chunk: int, kept: dict[str, dict[str, Any]]) -> None:
        old = shards.shard_path(self.shards, chunk)
        kept_members = []
        files = storage.at(old)
        if kept and files.exists(old):
            keep = set(kept)
            with files.open_read(old) as f:
                kept_members = [(key, members) for key, members in shards.read_shard(f) if key in keep]
        writer = shards.ShardWriter(self.shards, chunk)
        for key, members in kept_members:
            writer.add(key, members)
        self._open[chunk] = writer

    def write(self, chunk: int, item: Item, output: RenderedOutput,
              seconds: float) -> tuple[dict[str, Any], dict[str, bytes]]:
        """On a writer thread: encode only; `add` puts the members in the shard, in order."""
        meta = output_metadata(self.runtime, item, self.rank, seconds, output)
        meta["shard"] = output_folder.shard_file(chunk)
        data = encode_output(output, self.runtime, meta)
        record = (json.dumps(meta, sort_keys=True) + "\n").encode()
        return meta, {self.ext: data, output_folder.RECORD_EXTENSION: record}

    def add(self, chunk: int, item: Item, result: tuple[dict[str, Any], dict[str, bytes]]) -> dict[str, Any]:
        meta, members = result
        self._open[chunk].add(item.key, members)
        meta["status"] = "rendered"
        return meta

    def end_chunk(self, chunk: int) -> None:
        self._open.pop(chunk).close()

    def abandon_chunk(self, chunk: int) -> None:
        """A drained rank leaves the chunk unfinished: a shard is written whole, so its temporary
        goes and the next rank that takes the chunk renders the shard again (shardSize bounds it)."""
        writer = self._open.pop(chunk, None)
        if writer is not None:
            writer.abort()


def layout_for(runtime: RuntimeSpec, rank: int,
               trust: requests.FolderTrust = requests.TRUSTED) -> FilesLayout | WebDatasetLayout:
    if runtime.spec.output.layout == "webdataset":
        return WebDatasetLayout(runtime, rank, trust)
    return FilesLayout(runtime, rank, trust)
