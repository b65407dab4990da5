"""The pre-commit hooks run what CI runs: every check of hack/checks.sh, and the unit tests on push."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from tests.paths import REPO


def _ci_checks() -> list[str]:
    listed = subprocess.run(["bash", "hack/checks.sh", "--list"], cwd=REPO, capture_output=True, text=True,
                            check=True)
    return listed.stdout.split()


def _local_hooks() -> list[dict[str, Any]]:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    return [hook for repo in config["repos"] if repo["repo"] == "local" for hook in repo["hooks"]]


def _hook_running(check: str) -> dict[str, Any] | None:
    return next((h for h in _local_hooks() if h["entry"].split() == ["bash", "hack/checks.sh", check]), None)


def test_ci_runs_every_check_through_hack_checks_sh() -> None:
    # Called without arguments (its output aside, beside pytest), so it runs every check it lists.
    lines = [line.split("#")[0].strip() for line in (REPO / "hack" / "test.sh").open()]
    assert any(line.split(">")[0].split() == ["bash", "hack/checks.sh"] for line in lines)
    assert _ci_checks(), "hack/checks.sh --list names no check"


def test_every_check_ci_runs_has_a_pre_commit_hook() -> None:
    for check in _ci_checks():
        hook = _hook_running(check)
        assert hook is not None, f".pre-commit-config.yaml has no hook running `bash hack/checks.sh {check}`"
        assert hook["stages"] == ["pre-commit"], f"{hook['id']}: CI's checks run before each commit"
        assert hook["language"] == "system" and hook["pass_filenames"] is False, (
            f"{hook['id']}: the venv's tool on the whole tree, as CI runs it")


def test_the_unit_tests_run_before_a_push() -> None:
    hook = _hook_running("unit")
    assert hook is not None and hook["stages"] == ["pre-push"]
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    assert set(config["default_install_hook_types"]) == {"pre-commit", "pre-push"}
