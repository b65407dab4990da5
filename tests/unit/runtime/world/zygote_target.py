"""What the zygote tests run as a rank (`python -m` this module, forked from a cold zygote).

argv: `exit N` (prints its parent's pid, MARK and how many objects the collector leaves alone and
whether it runs, exits N),
`signal S` (kills itself with S),
`wait PIDFILE` (writes its pid, then waits for a signal)."""

import gc
import os
import sys
import time

what = sys.argv[1]
if what == "exit":
    print(f"parent {os.getppid()} mark {os.environ.get('MARK')} frozen {gc.get_freeze_count()} "
          f"collecting {gc.isenabled()}", flush=True)
    sys.exit(int(sys.argv[2]))
if what == "signal":
    os.kill(os.getpid(), int(sys.argv[2]))
if what == "wait":
    with open(sys.argv[2], "w") as f:
        f.write(str(os.getpid()))
    print("waiting", flush=True)
    while True:
        time.sleep(0.1)
raise SystemExit(f"unknown: {what}")
