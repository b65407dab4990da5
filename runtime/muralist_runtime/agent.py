"""A pod's launcher agent: `python -m muralist_runtime.agent MODULE ARGS...` runs the launcher
module (torch.distributed.run, or accelerate.commands.launch) in this process, exactly as
`python -m MODULE ARGS...` would, so that its own failure report can be left out when it only
repeats the runtime's verdict.

When a rank fails, torchrun logs the failed worker and raises ChildFailedError out of its
main (a 30-line report and a Python traceback); accelerate raises the same, or
CalledProcessError for a single process. Once a rank has written a permanent verdict to the
termination message (report/termination.py), that report says nothing the verdict does not, and it
buries the verdict's one line: so this agent exits 78 without it, and the launch entry point
prints the verdict once. In every other case (a retryable error, or a rank killed before it
could write anything: a signal, the OOM killer) the report stays as it is: it is then the only
word on a killed rank.

The workers inherit this process's stdout and stderr, as under the launcher alone: only the
agent's own report is left out, never a worker's line, and nothing is held back.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
from collections.abc import Sequence

from muralist_api import contract

from .report.termination import termination_text
from .world import zygote

# Where torchrun logs a failed worker ("failed (exitcode: 78) local_rank: 0 ...") and its
# closing of the others: the elastic agent's loggers, all under this name.
ELASTIC_LOGGER = "torch.distributed.elastic"


def permanent_verdict() -> bool:
    """Whether a rank of this pod has written a permanent verdict."""
    return contract.is_permanent(0, termination_text())


class _QuietAfterVerdict(logging.Filter):
    """Drops the elastic agent's warnings and errors once the verdict is permanent: they only
    report the rank that exited 78, and the stopping of the others."""

    def filter(self, record: logging.LogRecord) -> bool:
        elastic = record.name == ELASTIC_LOGGER or record.name.startswith(ELASTIC_LOGGER + ".")
        return not elastic or record.levelno < logging.WARNING or not permanent_verdict()


def _quiet_elastic_loggers() -> None:
    """Filter the handlers that the elastic agent's records reach (torch installs its own on
    import, under "torch"): a handler's filter sees the records of every module below it, a
    logger's only its own."""
    import torch  # noqa: F401  (sets up torch's log handlers)

    quiet = _QuietAfterVerdict()
    logger: logging.Logger | None = logging.getLogger(ELASTIC_LOGGER)
    handlers: list[logging.Handler] = []
    while logger is not None:
        handlers.extend(logger.handlers)
        logger = logger.parent if logger.propagate else None
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        handler.addFilter(quiet)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m muralist_runtime.agent MODULE [ARGS...]", file=sys.stderr)
        return 2
    module, *rest = args
    with zygote.collector_paused():  # its import of torch: 1.0 s instead of 1.15 s, measured
        _quiet_elastic_loggers()
    argv_before, sys.argv = sys.argv, [module, *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except Exception:
        if permanent_verdict():
            return contract.PERMANENT_FAILURE_EXIT_CODE
        raise
    finally:
        sys.argv = argv_before
    return contract.EXIT_OK


if __name__ == "__main__":
    code = main()
    # The workers have exited and the launcher has returned: skip the interpreter's teardown of
    # torch (about a second per process, measured), as the ranks do (muralist_runtime.__main__).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
