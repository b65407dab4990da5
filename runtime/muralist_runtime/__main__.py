"""`python -m muralist_runtime --spec FILE` (what torchrun / accelerate launch start)."""

import logging
import os
import sys

from .main import main

code = main()
# The run is over: its files, termination message and final progress post are written and its
# stores closed. Leave without the interpreter's teardown, where a C++ thread of torch's c10d
# store or gloo still running can abort a finished rank ("terminate called without an active
# exception", SIGABRT: once under a doubled test load), turning a success into a retry.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
