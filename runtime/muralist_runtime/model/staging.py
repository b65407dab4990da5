"""Node-local staging of the model (spec.model.loading.stage): fast cold starts.

Every process of a pod reads the whole pipeline at start. From a network volume (a shared
PVC cache) that is N processes x tens of GB over the network on every restart. Staging copies
the model directory once per node to MURALIST_STAGE_DIR (default /tmp/muralist-stage; the
operator mounts an emptyDir there) and every process loads from the copy; a restart on the
same node finds the marker and skips the copy.

Once per node without collectives: local rank 0 copies (to a temp dir, renamed into place,
then a marker file), the other local ranks poll for the marker. A copy can take longer than
the collective timeout, and a dead copier takes the whole group down with it under torchrun,
so a poll cannot hang. Pods that share a stage dir (a node-wide hostPath) take turns under a
file lock, which the kernel releases when its holder dies: the first downloads and copies,
the others find its marker.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from muralist_api.contract import DEFAULT_STAGE_DIR
from muralist_api.contract.env import PodEnv

from . import hub

log = logging.getLogger("muralist.stage")

MARKER = ".muralist-staged"
POLL_SECONDS = 0.5


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


@contextmanager
def _node_lock(dst: Path) -> Iterator[None]:
    """Held while one pod of the node stages `dst`; the others wait for it."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst.parent / f".{dst.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stage_model(source: str, revision: str | None, local_rank: int) -> tuple[Path, bool]:
    """(the staged directory, whether this call copied it). Call on every local rank."""
    dst = staged_path(source, revision)
    marker = dst / MARKER
    if marker.is_file():
        log.info("model already staged in %s", dst)
        return dst, False
    if local_rank == 0:
        with _node_lock(dst):
            if marker.is_file():
                log.info("model staged in %s by another pod meanwhile", dst)
                return dst, False
            start = time.perf_counter()
            src = local_source(source, revision)
            _copy(src, dst)
        log.info("staged %s to %s in %.1fs", src, dst, time.perf_counter() - start)
        return dst, True
    while not marker.is_file():
        time.sleep(POLL_SECONDS)
    return dst, False
