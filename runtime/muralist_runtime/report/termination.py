"""The termination message Kubernetes keeps after the container exits (the pod contract's
`Termination`, written to /dev/termination-log, or to MURALIST_TERMINATION_LOG's file)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from muralist_api import contract
from muralist_api.contract.env import PodEnv

log = logging.getLogger("muralist.progress")


def termination_log_path() -> Path | None:
    override = PodEnv.from_environ().termination_log
    if override:
        return Path(override)
    path = Path(contract.TERMINATION_LOG)
    return path if path.exists() else None


def termination_text() -> str:
    """The termination message written so far ("" when none, or none can be read)."""
    path = termination_log_path()
    try:
        return path.read_text() if path is not None else ""
    except OSError:
        return ""


def permanent_verdict_line(text: str) -> str | None:
    """The one line a launcher prints for a permanent verdict (field, message, exit code);
    None when the message holds none."""
    report = contract.Termination.parse(text) if text.strip() else None
    if report is None or not report.permanent:
        return None
    return f"muralist: {report.message} (exit {contract.PERMANENT_FAILURE_EXIT_CODE}: permanent, not retried)"


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT wait until the block ends, then act as they would have.

    torchrun stops the other ranks the moment one fails, and ranks that refuse the same spec
    fail at the same moment: one stopped between truncating the message and writing its own
    leaves the file empty, and the pod's permanent verdict is lost (seen under load, two ranks
    started together). Python handlers run in the main thread only, where this is called from;
    elsewhere the block runs unprotected.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.signal(signum, lambda signum, _frame: caught.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        for number in dict.fromkeys(caught):
            signal.raise_signal(number)


def write_termination(report: contract.Termination) -> None:
    """Replace the termination message under an exclusive lock, unless it holds a more severe one.

    Every local rank of a container writes the same file. Unlocked, two ranks failing together
    can interleave their writes into invalid JSON, and the operator loses the reason. A rank's
    PermanentFailure also outlives the Error another rank then hits in a collective, so the job
    is not retried in vain.
    """
    path = termination_log_path()
    if path is None:
        return
    try:
        with _stop_signals_held(), os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+",
                                             encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            if contract.message_severity(f.read()) > report.severity:
                return
            f.seek(0)
            f.truncate()
            f.write(report.to_json())
    except OSError as e:
        log.warning("cannot write the termination message to %s: %s", path, e)
