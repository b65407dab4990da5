"""`python -m muralist_runtime --spec FILE` (what torchrun / accelerate launch start)."""

import logging
import os
import sys

if os.environ.get("MURALIST_ZYGOTE"):  # world/zygote.py's ZYGOTE_ENV: fork this rank from a warm interpreter
    from .world.zygote import delegate

    delegate()  # returns only when the zygote declines: then this process is the rank

from .world.zygote import QUIET_LIBRARIES, preload_unwatched

for name, value in QUIET_LIBRARIES.items():
    os.environ.setdefault(name, value)  # read by the libraries as they are imported
preload_unwatched([])  # what a zygote would have imported for this rank, as quickly

from .main import main  # noqa: E402  (the libraries first, the collector paused)

code = main()
# The run is over: its files, termination message and final progress post are written and its
# stores closed. Leave without the interpreter's teardown, where a C++ thread of torch's c10d
# store or gloo still running can abort a finished rank ("terminate called without an active
# exception", SIGABRT: once under a doubled test load), turning a success into a retry.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
