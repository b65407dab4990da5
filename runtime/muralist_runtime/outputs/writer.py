"""Writing safely: atomic files, the job file, and the writer threads that keep the GPU busy.

Every file is written whole through the output tree's storage (storage.py): on a volume to a temp
name in the same directory and `os.replace`d, so no reader ever sees a partial file (temps.py names
the temps and removes those of killed writers); in object storage as one PUT.

Outputs never block the GPU: `BackgroundWriter` encodes and writes items on worker threads
fed by a bounded queue; the generating loop waits only when the queue is full. An item counts
as completed only once its files are on disk, and an encode or write error is raised in the
generating thread at its next submit (or at close), failing the run.
"""

from __future__ import annotations

import json
import platform
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muralist_api.contract import PermanentFailure, output_format, resume
from muralist_api.contract.output_folder import JOB_FILE, JobRecord
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec

from . import requests, storage, temps

# Items waiting to be written: enough to ride out a slow volume for a few images, few enough
# that host memory stays small (8 decoded 1024x1024 RGB images are 24 MiB).
WRITE_QUEUE_SIZE = 8
# Encoding threads: zlib / libjpeg / libwebp release the GIL, so two keep up with a fast GPU.
WRITE_THREADS = 2
# A rank that renders on its CPU keeps its cores busy itself, and an item's write is a few percent of its
# render: one thread keeps up, and a second only competes with the rendering for the cores (the tiny Flux on
# two cores, two ranks: 0.4 s of a rank's 7.6 s of rendering, measured).
CPU_WRITE_THREADS = 1


def write_threads(gpu: bool) -> int:
    return WRITE_THREADS if gpu else CPU_WRITE_THREADS


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = True) -> None:
    storage.at(path).write(path, data, fsync=fsync)


def atomic_write_text(path: Path, text: str, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), fsync=fsync)


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("torch", "diffusers", "transformers", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


class JobFile:
    """The job file (contract/output_folder.py's `JobRecord`): the resolved spec, library versions, the
    world, the resume digest, the output format and the folder's chunks (contract/output_format.py), timings."""

    def __init__(self, runtime: RuntimeSpec):
        self.runtime = runtime
        self.root = Path(runtime.output_dir)
        self.path = self.root / JOB_FILE
        self.chunks: output_format.Chunks | None = None  # recorded by write(): the work plan's cut

    @property
    def where(self) -> str:
        """The job's folder as its readers name it (a path, or a URI)."""
        return storage.at(self.root).where(self.root)

    def check_existing(self) -> tuple[JobRecord | None, requests.FolderTrust]:
        """Check the folder's job file before any item is kept (every rank reads): returns it (None when
        there is none yet) and how far records of older versions may be trusted.

        Refused (exit 78, naming the field): a folder of an output format this version does not read, a
        job file that is not one, a folder another job wrote (unless spec.output.shared). A job file that
        cannot be read now (a store's transient error) is an error of the run, retried: never taken for
        a new folder, whose first writer would replace it. Which items are kept is then each item's request
        digest's to say (requests.py); the job-wide digest decides only for records of older versions.
        """
        try:
            raw = storage.at(self.path).read_bytes(self.path)
        except FileNotFoundError:
            return None, requests.TRUSTED
        except OSError as e:
            e.add_note(f"muralist: cannot read {storage.at(self.path).where(self.path)} now; the run fails and is "
                       "retried")
            raise
        try:
            parsed = json.loads(raw)
        except ValueError as e:
            parsed = e
        if not isinstance(parsed, dict):
            raise PermanentFailure("spec.output.path", f"{storage.at(self.path).where(self.path)} is not a job file "
                                   "of Muralist (not a JSON object); move it away, or use another output.path")
        try:
            recorded = output_format.read_job_record(parsed)
        except output_format.NewerFormat as e:
            raise PermanentFailure("spec.output.path", f"{self.where} {e}; run it with that version, or use "
                                   "another output.path") from None
        except output_format.FormatError as e:
            raise PermanentFailure("spec.output.path", f"{self.where} {e}; move its {JOB_FILE} away, or use "
                                   "another output.path") from None
        other = resume.other_job(recorded, self.runtime.namespace, self.runtime.name)
        if other is not None and not self.runtime.spec.output.shared:
            raise PermanentFailure("spec.output", f"{self.where} holds the outputs of DiffusionJob {other}, not of "
                                   f"{self.runtime.namespace}/{self.runtime.name}; use another spec.output.path, or "
                                   "set spec.output.shared: true to render into it (its items made for the same "
                                   "request are kept)")
        return recorded, requests.FolderTrust(legacy=resume.mismatch(recorded, self.runtime.spec) is None)

    def merged(self) -> bool:
        """Whether the job's outputs were merged already (the job file counts its items)."""
        try:
            return JobRecord.model_validate_json(storage.at(self.path).read_bytes(self.path)).merged
        except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
            return False

    def write(self, world: dict[str, int], timings: dict[str, float] | None = None,
              summary: dict[str, Any] | None = None) -> None:
        """The job file: what the job is, where it runs; at the merge, the `summary` (the items by status,
        the cache's summaries: JobRecord's fields by their names in the file) and the `timings`."""
        record = JobRecord.model_validate({
            "name": self.runtime.name,
            "namespace": self.runtime.namespace,
            "digestVersion": resume.DIGEST_VERSION,
            "specDigest": resume.spec_digest(self.runtime.spec),
            "outputFormat": output_format.OUTPUT_FORMAT,
            **({"plan": self.chunks} if self.chunks is not None else {}),
            "spec": self.runtime.model_dump(by_alias=True, mode="json", exclude_none=True),
            "versions": library_versions(),
            "world": world,
            **(summary or {}),
            **{k: round(v, 3) for k, v in (timings or {}).items()},
        })
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, record.to_text())


# -- background writing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """An item the writer threads finished: on disk (files), or encoded (webdataset)."""

    chunk: int
    item: Item
    seconds: float
    result: Any


_STOP = object()


class BackgroundWriter:
    """Runs `write(chunk, item, image, seconds)` on worker threads, fed by a bounded queue.

    `submit` blocks only while `maxsize` images wait; `completed()` returns the images written
    since the last call (in completion order, which with several threads need not be the
    submission order); `close()` drains the queue and stops the threads. The first error of a
    write is raised by the next `submit` and by `close` (images after it are dropped: the run
    fails, and a restart renders what is missing).

    No wait is without a bound: when no write finishes for `stall_seconds` (a volume or a bucket that
    stopped answering) while one is awaited, WriteStalled is raised (a failure of the run, retried).
    """

    def __init__(self, write: Callable[[int, Item, Any, float], Any],
                 maxsize: int = WRITE_QUEUE_SIZE, threads: int = WRITE_THREADS, stall_seconds: float = 600.0,
                 where: str = "the output"):
        self._write = write
        self.stall_seconds, self.where = stall_seconds, where
        self._last_done = time.monotonic()
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
                    chunk, work, image, seconds = item
                    self._done.put(Written(chunk, work, seconds, self._write(chunk, work, image, seconds)))
                    self._last_done = time.monotonic()
            except BaseException as e:  # handed to the generating thread
                with self._error_lock:
                    if self._error is None:
                        self._error = e
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if isinstance(self._error, temps.TempRemoved):
            raise self._error  # not a failed write: the job merged meanwhile (main.py ends the run)
        if self._error is not None:
            raise RuntimeError(f"writing an image failed: {self._error}") from self._error

    def submit(self, chunk: int, item: Item, image: Any, seconds: float) -> None:
        self._raise()

        def queued(timeout: float) -> bool:
            try:
                self._queue.put((chunk, item, image, seconds), timeout=timeout)
            except queue.Full:
                return False
            return True

        self._wait(queued, "a place in the queue of items to write")

    def wait_idle(self) -> None:
        """Wait until every submitted image is written (or dropped after an error)."""
        done = self._queue.all_tasks_done

        def idle(timeout: float) -> bool:
            with done:
                if self._queue.unfinished_tasks:
                    done.wait(timeout)
                return not self._queue.unfinished_tasks

        self._wait(idle, "the items in the queue to be written")
        self._raise()

    def _wait(self, ready: Callable[[float], bool], what: str) -> None:
        """Until `ready(timeout)` says so, as long as writes finish: WriteStalled once none has for the bound
        (counted from the later of the last write and the start of this wait)."""
        start = time.monotonic()
        while True:
            quiet = time.monotonic() - max(self._last_done, start)
            if quiet >= self.stall_seconds:
                raise WriteStalled(f"waited {quiet:.0f}s for {what}: no write to {self.where} finished meanwhile "
                                   "(parallelism.collectiveTimeoutSeconds); is it answering?")
            if ready(min(1.0, self.stall_seconds - quiet)):
                return

    def completed(self) -> list[Written]:
        out: list[Written] = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def close(self, raise_error: bool = True) -> None:
        """Drain the queue, stop the threads; idempotent. A thread stuck in a write past the bound is left
        behind (a daemon: it goes with the process) and, with `raise_error`, WriteStalled says so."""
        stalled: WriteStalled | None = None
        if not self._closed:
            self._closed = True
            try:
                for _ in self._threads:
                    self._wait(lambda timeout: _put(self._queue, _STOP, timeout), "the writer threads to stop")
                for t in self._threads:
                    def finished(timeout: float, thread: threading.Thread = t) -> bool:
                        return not _join(thread, timeout)

                    self._wait(finished, "the writer threads to finish")
            except WriteStalled as e:
                stalled = e
        if raise_error:
            self._raise()
            if stalled is not None:
                raise stalled


class WriteStalled(RuntimeError):
    """No write of an item finished for the writer's bound while the run waited for one."""


def _put(q: queue.Queue[Any], value: Any, timeout: float) -> bool:
    try:
        q.put(value, timeout=timeout)
    except queue.Full:
        return False
    return True


def _join(thread: threading.Thread, timeout: float) -> bool:
    """Whether the thread is still alive after waiting for it."""
    thread.join(timeout)
    return thread.is_alive()
