"""The output writer: images, their metadata, manifests, job.json and the gallery.

Layout under the output directory (DESIGN.md):

    images/<key>.<format>    the image   (key = <prompt-index>-<image-index>, e.g. 00003-000)
    images/<key>.json        its metadata
    manifest.rank-<r>.jsonl  what rank r did (appended, across restarts)
    manifest.jsonl           one line per image on disk, sorted by key (rank 0, at the end)
    job.json                 resolved spec, library versions, world layout (rank 0)
    index.html               the gallery (rank 0)

Completeness: every file is written to a temp name in the same directory and `os.replace`d,
so no reader ever sees a partial file. The metadata goes first and the image last, so an
image on disk means its metadata is there too: "both present" = complete, and resume skips
exactly those. A temp file left by a killed process (`.<name>.<pid>.tmp`) is removed at start.

Outputs never block the GPU: `BackgroundWriter` encodes (PNG/JPEG/WebP) and writes images on
worker threads fed by a bounded queue; the generating loop waits only when the queue is full.
An image counts as completed only once its files are on disk, and an encode or write error
is raised in the generating thread at its next submit (or at close), failing the run.
"""

from __future__ import annotations

import html
import json
import os
import platform
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .spec import resume
from .spec.contract import PermanentFailure
from .spec.items import ImageTask
from .spec.resolved import RuntimeSpec

TMP_SUFFIX = ".tmp"
PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
# Deterministic fields only: the PNG bytes then depend on the pixels alone, so the same job
# gives byte-identical files on any world size (rank and seconds live in the JSON).
PNG_TEXT_FIELDS = ("prompt", "negativePrompt", "seed", "steps", "guidanceScale", "height",
                   "width", "model", "revision", "dtype")
# Images waiting to be written: enough to ride out a slow volume for a few images, few enough
# that host memory stays small (8 decoded 1024x1024 RGB images are 24 MiB).
WRITE_QUEUE_SIZE = 8
# Encoding threads: zlib / libjpeg / libwebp release the GIL, so two keep up with a fast GPU.
WRITE_THREADS = 2


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("torch", "diffusers", "transformers", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


class OutputWriter:
    def __init__(self, runtime: RuntimeSpec, rank: int):
        self.runtime = runtime
        self.rank = rank
        self.root = Path(runtime.output_dir)
        self.images = self.root / "images"
        self.ext = runtime.spec.output.format
        self._log_lock = threading.Lock()  # writer threads append to the rank manifest

    # -- paths and state -----------------------------------------------------------------------

    def image_path(self, task: ImageTask) -> Path:
        return self.images / f"{task.key}.{self.ext}"

    def meta_path(self, task: ImageTask) -> Path:
        return self.images / f"{task.key}.json"

    def is_complete(self, task: ImageTask) -> bool:
        return self.image_path(task).is_file() and self.meta_path(task).is_file()

    # -- start ---------------------------------------------------------------------------------

    def check_existing_job(self) -> None:
        """Refuse to mix images of different parameters in one directory (every rank reads).

        The resume contract (spec/resume.py) decides: a folder written by an older version of
        the same job resumes; one of other parameters is refused, naming the field to change.
        """
        job = self.root / "job.json"
        if not job.is_file():
            return
        try:
            recorded = json.loads(job.read_text())
        except (OSError, ValueError):
            return  # unreadable: rank 0 rewrites it
        if not isinstance(recorded, dict):
            return
        why = resume.mismatch(recorded, self.runtime.spec)
        if why:
            raise PermanentFailure("spec.output.path", f"{self.root} {why}; use another output.path or empty it")

    def prepare(self) -> None:
        """Create the directories and remove temp files of killed processes (rank 0, first)."""
        self.images.mkdir(parents=True, exist_ok=True)
        for d in (self.root, self.images):
            for stale in d.glob(f".*{TMP_SUFFIX}"):
                stale.unlink(missing_ok=True)

    def write_job(self, layout: dict[str, int], timings: dict[str, float] | None = None) -> None:
        """job.json; rewritten at the end with the timings (loadSeconds, generateSeconds...)."""
        doc: dict[str, Any] = {
            "name": self.runtime.name,
            "namespace": self.runtime.namespace,
            "digestVersion": resume.DIGEST_VERSION,
            "specDigest": resume.spec_digest(self.runtime.spec),
            "spec": self.runtime.model_dump(by_alias=True, mode="json", exclude_none=True),
            "versions": library_versions(),
            "world": layout,
        }
        if timings:
            doc.update({k: round(v, 3) for k, v in timings.items()})
        atomic_write_text(self.root / "job.json", json.dumps(doc, indent=2) + "\n")

    # -- per image -----------------------------------------------------------------------------

    def metadata(self, task: ImageTask, seconds: float) -> dict[str, Any]:
        spec = self.runtime.spec
        gen = spec.generation
        return {
            "key": task.key,
            "promptIndex": task.prompt_index,
            "imageIndex": task.image_index,
            "prompt": task.prompt,
            "negativePrompt": task.negative_prompt,
            "seed": task.seed,
            "steps": gen.steps,
            "guidanceScale": gen.guidance_scale,
            "height": gen.height,
            "width": gen.width,
            "model": spec.model.name,
            "revision": spec.model.revision,
            "dtype": spec.model.dtype,
            "rank": self.rank,
            "seconds": round(seconds, 4),
            "file": f"images/{task.key}.{self.ext}",
        }

    def write_image(self, task: ImageTask, image: Any, seconds: float) -> dict[str, Any]:
        """Write metadata then the image (a PIL image), both atomically; return the metadata."""
        import io

        meta = self.metadata(task, seconds)
        atomic_write_text(self.meta_path(task), json.dumps(meta, indent=2) + "\n")
        buf = io.BytesIO()
        kwargs: dict[str, Any] = {}
        if self.ext == "png":
            from PIL.PngImagePlugin import PngInfo

            info = PngInfo()
            for field in PNG_TEXT_FIELDS:
                if meta[field] is not None:
                    info.add_text(field, str(meta[field]))
            kwargs["pnginfo"] = info
        else:
            kwargs["quality"] = 95
        image.save(buf, format=PIL_FORMATS[self.ext], **kwargs)
        atomic_write_bytes(self.image_path(task), buf.getvalue())
        self.log(task, "rendered", seconds)
        return meta

    def log(self, task: ImageTask, status: str, seconds: float = 0.0) -> None:
        """Append to this rank's manifest (one small write: whole lines on a local disk)."""
        line = {"key": task.key, "status": status, "rank": self.rank, "seconds": round(seconds, 4)}
        with self._log_lock, open(self.root / f"manifest.rank-{self.rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    # -- end (rank 0, after a barrier) ---------------------------------------------------------

    def merge_manifest(self, tasks: Sequence[ImageTask]) -> list[dict[str, Any]]:
        """manifest.jsonl: one line per complete image on disk, sorted by key.

        The per-image JSON is the source of truth (it is what a restart trusts too); the
        per-rank manifests add each image's latest status (rendered / skipped).
        """
        status: dict[str, str] = {}
        for part in sorted(self.root.glob("manifest.rank-*.jsonl")):
            for raw in part.read_text().splitlines():
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue  # a line cut by a kill
                status[entry["key"]] = entry["status"]
        lines: list[dict[str, Any]] = []
        for task in sorted(tasks, key=lambda t: t.key):
            if not self.is_complete(task):
                continue
            try:
                meta = json.loads(self.meta_path(task).read_text())
            except (OSError, ValueError):
                continue
            meta["status"] = status.get(task.key, "skipped")
            lines.append(meta)
        atomic_write_text(self.root / "manifest.jsonl",
                          "".join(json.dumps(m, sort_keys=True) + "\n" for m in lines))
        return lines

    def write_gallery(self, entries: Iterable[dict[str, Any]]) -> Path:
        path = self.root / "index.html"
        atomic_write_text(path, gallery_html(self.runtime.name, entries))
        return path


# -- background writing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """An image whose files are on disk."""

    task: ImageTask
    seconds: float


_STOP = object()


class BackgroundWriter:
    """Runs `write(task, image, seconds)` on worker threads, fed by a bounded queue.

    `submit` blocks only while `maxsize` images wait; `completed()` returns the images written
    since the last call (in completion order, which with several threads need not be the
    submission order); `close()` drains the queue and stops the threads. The first error of a
    write is raised by the next `submit` and by `close` (images after it are dropped: the run
    fails, and a restart renders what is missing).
    """

    def __init__(self, write: Callable[[ImageTask, Any, float], object],
                 maxsize: int = WRITE_QUEUE_SIZE, threads: int = WRITE_THREADS):
        self._write = write
        self._queue: queue.Queue[Any] = queue.Queue(maxsize)
        self._done: queue.SimpleQueue[Written] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name=f"muralist-writer-{i}",
                                          daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:  # after a failure, drop the rest: the run is failing
                    task, image, seconds = item
                    self._write(task, image, seconds)
                    self._done.put(Written(task, seconds))
            except BaseException as e:  # handed to the generating thread
                with self._error_lock:
                    if self._error is None:
                        self._error = e
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"writing an image failed: {self._error}") from self._error

    def submit(self, task: ImageTask, image: Any, seconds: float) -> None:
        self._raise()
        self._queue.put((task, image, seconds))

    def wait_idle(self) -> None:
        """Wait until every submitted image is written (or dropped after an error)."""
        self._queue.join()
        self._raise()

    def completed(self) -> list[Written]:
        out: list[Written] = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def close(self, raise_error: bool = True) -> None:
        """Drain the queue, stop the threads; idempotent."""
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                self._queue.put(_STOP)
            for t in self._threads:
                t.join()
        if raise_error:
            self._raise()


def gallery_html(title: str, entries: Iterable[dict[str, Any]]) -> str:
    """A plain, self-contained HTML page; every user string is escaped."""
    esc = html.escape
    cards = []
    for m in entries:
        neg = m.get("negativePrompt")
        cards.append(
            "<figure>"
            f'<a href="{esc(m["file"])}"><img src="{esc(m["file"])}" loading="lazy" '
            f'alt="{esc(m["prompt"])}"></a>'
            f"<figcaption><b>{esc(m['key'])}</b> seed {esc(str(m['seed']))}<br>"
            f"{esc(m['prompt'])}"
            + (f"<br><i>not: {esc(neg)}</i>" if neg else "")
            + "</figcaption></figure>"
        )
    return (
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)} - Muralist</title><style>"
        "body{font-family:sans-serif;margin:1em}main{display:flex;flex-wrap:wrap;gap:12px}"
        "figure{margin:0;width:200px}img{width:200px;height:auto;image-rendering:pixelated}"
        "figcaption{font-size:12px}</style></head><body>"
        f"<h1>{esc(title)}</h1><p>{len(cards)} images</p><main>\n"
        + "\n".join(cards)
        + "\n</main></body></html>\n"
    )
