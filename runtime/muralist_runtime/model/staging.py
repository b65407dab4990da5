"""Node-local staging of the model (spec.model.loading.stage): fast cold starts.

Every process of a pod reads the whole pipeline at start. From a network volume (a shared
PVC cache) that is N processes x tens of GB over the network on every restart. Staging copies
the model directory once per node to MURALIST_STAGE_DIR (default /tmp/muralist-stage; the
operator mounts an emptyDir there) and every process loads from the copy; a restart on the
same node finds the marker and skips the copy.

Once per node without collectives: local rank 0 copies (to a temp dir, renamed into place,
then a marker file), the other local ranks poll for the marker. A copy can take longer than
the collective timeout, so the waiters bound their wait by the copier's heartbeat, not by the
copy: a file it touches every HEARTBEAT_SECONDS while it stages. A dead copier takes its group
down with it under torchrun; a stuck one (a volume or a download that stopped answering) stops
beating, and its waiters fail (retryable) once it has been quiet for the bound, naming what they
waited for. Pods that share a stage dir (a node-wide hostPath) take turns under a file lock,
which the kernel releases when its holder dies, tried again and again within the same bound: the
first downloads and copies, the others find its marker.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from muralist_api.contract import DEFAULT_STAGE_DIR
from muralist_api.contract.env import PodEnv

from . import hub

log = logging.getLogger("muralist.stage")

MARKER = ".muralist-staged"
POLL_SECONDS = 0.5
HEARTBEAT_SECONDS = 5.0


class StagingStalled(RuntimeError):
    """The rank or pod staging the model gave no sign of progress for the bound."""


def stage_root() -> Path:
    return Path(PodEnv.from_environ().stage_dir or DEFAULT_STAGE_DIR)


def local_source(source: str, revision: str | None) -> Path:
    """The model as a local directory: as given, or the hub snapshot (downloaded if needed)."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    with hub.hub_errors(source, revision, hub.MODEL):
        return Path(snapshot_download(source, revision=revision, token=hub.token()))


def staged_path(source: str, revision: str | None) -> Path:
    """One directory per (source, revision): a new revision never reuses an old copy."""
    digest = hashlib.sha256(f"{source}@{revision or ''}".encode()).hexdigest()[:12]
    name = source.rstrip("/").rsplit("/", 1)[-1] or "model"
    return stage_root() / f"{name}-{digest}"


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        # symlinks=False: hub snapshots are symlinks into the blob store; copy the bytes.
        shutil.copytree(src, tmp, symlinks=False, dirs_exist_ok=True)
        if dst.exists():
            shutil.rmtree(dst)  # a copy without its marker: cut short by a kill
        os.replace(tmp, dst)
        (dst / MARKER).write_text(f"{src}\n")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _heartbeat_path(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.heartbeat"


@contextmanager
def _beating(dst: Path) -> Iterator[None]:
    """Touch dst's heartbeat every HEARTBEAT_SECONDS while the body stages it."""
    beat = _heartbeat_path(dst)
    stop = threading.Event()

    def run() -> None:
        while True:
            beat.touch()
            if stop.wait(HEARTBEAT_SECONDS):
                return

    thread = threading.Thread(target=run, name="muralist-staging-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        beat.unlink(missing_ok=True)


def _wait(dst: Path, ready: Callable[[], bool], quiet_seconds: float, what: str) -> None:
    """Until `ready()`, while the stager of dst beats: StagingStalled once it has been quiet for the bound
    (counted from the later of its last beat and the start of this wait)."""
    start = time.time()
    while not ready():
        try:
            last = _heartbeat_path(dst).stat().st_mtime
        except FileNotFoundError:
            last = 0.0
        quiet = time.time() - max(last, start)
        if quiet >= quiet_seconds:
            raise StagingStalled(f"waited {quiet:.0f}s for {what} with no sign of progress from it "
                                 f"(parallelism.collectiveTimeoutSeconds): is {dst.parent} answering, and the "
                                 "model's source?")
        time.sleep(POLL_SECONDS)


@contextmanager
def _node_lock(dst: Path, quiet_seconds: float) -> Iterator[None]:
    """Held while one pod of the node stages `dst`; the others wait for it (bounded by its heartbeat)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst.parent / f".{dst.name}.lock", "w") as lock:

        def taken() -> bool:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        _wait(dst, taken, quiet_seconds, f"another pod of this node to stage {dst.name}")
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stage_model(source: str, revision: str | None, local_rank: int,
                quiet_seconds: float = 600.0) -> tuple[Path, bool]:
    """(the staged directory, whether this call copied it). Call on every local rank. A rank waits for
    the one staging as long as it beats; `quiet_seconds` of silence fail the wait (StagingStalled)."""
    dst = staged_path(source, revision)
    marker = dst / MARKER
    if marker.is_file():
        log.info("model already staged in %s", dst)
        return dst, False
    if local_rank == 0:
        with _node_lock(dst, quiet_seconds):
            if marker.is_file():
                log.info("model staged in %s by another pod meanwhile", dst)
                return dst, False
            start = time.perf_counter()
            with _beating(dst):
                src = local_source(source, revision)
                _copy(src, dst)
        log.info("staged %s to %s in %.1fs", src, dst, time.perf_counter() - start)
        return dst, True
    _wait(dst, marker.is_file, quiet_seconds, f"local rank 0 to stage {dst.name}")
    return dst, False
