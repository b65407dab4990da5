"""Debian packages the test tiers install on a new machine (Docker, Chromium, the real node's):
one apt at a time. Test workers start their tiers at once, and apt refuses to run beside another
apt ("Could not get lock /var/lib/dpkg/lock-frontend": the browser tier failed so on a machine
from empty caches while the image tier installed docker.io)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

# Ours: the test workers and hack/dev-cluster.sh take it around every apt-get they run.
LOCK = Path(tempfile.gettempdir()) / "muralist-apt.lock"
# Another apt on the machine (not ours): apt-get waits for dpkg's lock instead of failing at once.
WAIT_FOR_DPKG = ("-o", "DPkg::Lock::Timeout=600")


def install(packages: Sequence[str], timeout: float = 900) -> str | None:
    """apt-get update, then install `packages`; None when done, else what failed (command, code, stderr)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for args in (["apt-get", *WAIT_FOR_DPKG, "update"],
                     ["apt-get", *WAIT_FOR_DPKG, "install", "-y", "--no-install-recommends", *packages]):
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
            if proc.returncode != 0:
                return f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return None
