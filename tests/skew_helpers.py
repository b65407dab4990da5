"""The release before, for the skew tests: the packages of SKEW_BASELINE (hack/versions.env) taken out of
git into a folder, to run beside this tree's (tests/runtime/test_skew.py, tests/cluster/test_skew.py).

The baseline's packages come first on PYTHONPATH, ahead of the venv's editable install of this tree,
and use the venv's libraries (this tree's lock): its image would carry its own lock, the same as long as
the lock has not moved since; a library update that breaks the baseline fails these tests, and says that
images of the release before need their own libraries from then on. A clone without the baseline's
commit fails here, loudly: CI clones the whole history, and a shallow clone needs `git fetch --unshallow`.
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.paths import REPO

PACKAGES = ("api", "cli", "operator", "runtime")


def baseline_commit() -> str:
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SKEW_BASELINE":
            return value.strip()
    raise AssertionError("hack/versions.env has no SKEW_BASELINE=<commit>")


def extract_baseline(dest: Path) -> Path:
    """The baseline's api/, cli/, operator/ and runtime/ under `dest`."""
    commit = baseline_commit()
    archive = dest / "baseline.tar"
    made = subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), commit, *PACKAGES], cwd=REPO,
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.fail(f"the skew baseline {commit} (SKEW_BASELINE in hack/versions.env) is not in this clone "
                    f"({made.stderr.strip()}): the skew tests need the full history (git fetch --unshallow)",
                    pytrace=False)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return dest


def pythonpath(tree: Path) -> str:
    """PYTHONPATH that puts the baseline's packages ahead of this tree's."""
    return ":".join(str(tree / package) for package in PACKAGES)


@pytest.fixture(scope="session")
def baseline_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_baseline(tmp_path_factory.mktemp("skew-baseline"))
