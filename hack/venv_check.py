"""Does this interpreter's environment hold what a lock file pins? hack/env.sh's ensure_venv asks before it
runs pip, so that a venv that already matches costs a fraction of a second, not pip's resolution.

    python hack/venv_check.py LOCK [EDITABLE_DIR...]

Exit 0 when every pin of LOCK whose environment marker holds here is installed at exactly its version, and
each EDITABLE_DIR (a project folder: api/, the clone's root) is installed editable from that folder (the
venv follows whichever clone installed it last); 1, naming the first difference, otherwise. Packages the lock
does not name are left alone (pip never removes them either). Standard library and `packaging` only.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import metadata
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)\s*(?:;([^\\]*))?")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: Path) -> list[tuple[str, str, str | None]]:
    """(name, version, marker or None) of each pin: the lines that start with a name (hashes follow on
    continuation lines, comments start with '#')."""
    out = []
    for line in lock.read_text().splitlines():
        found = PIN.match(line)
        if found:
            name, version, marker = found.groups()
            out.append((normalise(name), version, marker.strip() if marker and marker.strip() else None))
    return out


def first_difference(lock: Path, editable_dirs: list[Path]) -> str | None:
    try:
        from packaging.markers import Marker
        from packaging.version import Version
    except ImportError:
        return "packaging is not installed"
    installed = {normalise(d.metadata["Name"]): d for d in metadata.distributions()}
    for name, version, marker in pins(lock):
        if marker is not None and not Marker(marker).evaluate():
            continue
        dist = installed.get(name)
        if dist is None:
            return f"{name} is not installed ({lock.name} pins {version})"
        if Version(dist.version) != Version(version):
            return f"{name} {dist.version} is installed, {lock.name} pins {version}"
    for folder in editable_dirs:
        if not any(_editable_from(d, folder) for d in installed.values()):
            return f"{folder} is not installed editable"
    return None


def _editable_from(dist: metadata.Distribution, folder: Path) -> bool:
    try:
        origin = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return bool(origin.get("dir_info", {}).get("editable")) and origin.get("url") == folder.resolve().as_uri()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    difference = first_difference(Path(argv[0]), [Path(a) for a in argv[1:]])
    if difference is not None:
        print(f"the venv differs from {argv[0]}: {difference}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
