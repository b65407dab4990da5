"""Where items go: the two output layouts (the chunk part files that say what is done: parts.py).

Layout under the output directory (spec.output.layout; every name is the output-folder contract's,
muralist_api/contract/output_folder.py):

    files:       images/<key>.<format> and images/<key>.json (metadata first, image last: an
                 image on disk means its metadata is there too); a video's poster frame
                 images/<key>.poster.jpg, and image-conditioned items' input thumbnails
                 images/<key>.input.jpg / .mask.jpg, for the gallery (written before the output)
    webdataset:  shards/shard-<chunk>.tar, members <key>.<format> + <key>.json per item
    both:        parts/chunk-<chunk>.jsonl, a chunk's "done" marker (parts.py); the manifest, the
                 index, the job file and the gallery (merge.py, at the end)

Every file is written to a temp name and renamed, so no reader sees a partial one; a rank
killed mid-chunk costs that chunk's unfinished items (files) or its shard (webdataset).
Folders of older versions are read through muralist_api/contract/output_format.py (here by
`kept`): that module is the format's contract, and this one never reads around it.
Encoding happens on writer threads (writer.BackgroundWriter): `FilesLayout.write` writes an
item's files there; `WebDatasetLayout.write` only encodes, and the generating thread adds the
members to the shard in item order (`add`), so a shard's bytes do not depend on thread timing.
"""

from __future__ import annotations

import io
import json
import logging
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muralist_api.contract import output_folder, output_format
from muralist_api.items import Item, printable
from muralist_api.runtime_spec import RuntimeSpec

from . import media, requests, shards, storage, temps
from .parts import read_part
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
        self._unsynced[chunk] = [self.root / name for key in kept
                                 for name in (output_folder.record_file(key), output_folder.item_file(key, self.ext))]

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
