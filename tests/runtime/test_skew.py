"""The skew matrix, runtime half: this tree's operator with the runtime of the release before
(SKEW_BASELINE in hack/versions.env, taken out of git by tests/skew_helpers.py).

The CPU quickstart, rendered by this tree's operator (its `<job>-spec` ConfigMap, byte for byte but the
output folder), runs through the baseline's launch entry point under torchrun and renders; the same spec
with a field the baseline's image lacks is refused by its ranks, exit 78, naming the field. Whatever field
this tree adds, at its default it never reaches an older image (api/muralist_api/contract/versions.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from muralist_api import contract
from muralist_api.rules.problems import parse_job
from muralist_operator.render import render_children
from muralist_operator.settings import OperatorSettings

from tests.paths import REPO
from tests.runtime.conftest import torchrun, without_zygote
from tests.skew_helpers import baseline_commit, baseline_tree, pythonpath

__all__ = ["baseline_tree"]  # the fixture, for pytest
pytestmark = pytest.mark.torchrun


def operator_spec(output: Path) -> dict[str, Any]:
    """examples/quickstart-cpu.yaml cut to two images on one process, as this tree's operator writes it."""
    manifest = next(d for d in yaml.safe_load_all((REPO / "examples" / "quickstart-cpu.yaml").read_text())
                    if d.get("kind") == "DiffusionJob")
    manifest["spec"]["prompts"] = manifest["spec"]["prompts"][:2]
    manifest["spec"]["generation"]["imagesPerPrompt"] = 1
    manifest["spec"]["parallelism"]["processesPerNode"] = 1
    config_map = render_children(parse_job(manifest), "default", OperatorSettings()).spec_config_map
    spec: dict[str, Any] = json.loads(config_map["data"][contract.SPEC_KEY])
    spec["outputDir"] = str(output)  # the pod's /output/quickstart, here
    return spec


def baseline_env(runtime_env: dict[str, str], tree: Path) -> dict[str, str]:
    return {**without_zygote(runtime_env), "PYTHONPATH": pythonpath(tree)}  # the zygote runs this tree's code


def test_the_runtime_of_the_release_before_renders_what_this_operator_writes(
        tmp_path: Path, runtime_env: dict[str, str], baseline_tree: Path) -> None:
    env = baseline_env(runtime_env, baseline_tree)
    where = subprocess.run([sys.executable, "-c", "import muralist_runtime as r, muralist_api as a; "
                            "print(r.__file__); print(a.__file__)"], env=env, capture_output=True, text=True,
                           cwd=tmp_path, check=True).stdout.split()
    assert all(Path(f).is_relative_to(baseline_tree) for f in where), where
    out = tmp_path / "out"
    run = torchrun(json.dumps(operator_spec(out)), out, env)
    assert run.returncode == 0, f"the runtime of {baseline_commit()} failed:\n{run.stderr[-3000:]}"
    assert sorted(run.images()) == ["00000-000.png", "00001-000.png"]
    assert [r["status"] for r in run.manifest()] == ["rendered", "rendered"]


def test_the_runtime_of_the_release_before_refuses_a_field_it_lacks_by_name(
        tmp_path: Path, runtime_env: dict[str, str], baseline_tree: Path) -> None:
    spec = operator_spec(tmp_path / "out")
    spec["spec"]["generation"]["futureGuard"] = "strict"  # a feature of a later release, in use
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    termination = tmp_path / "termination"
    # A rank, as the launcher starts it (the baseline's launch entry point exits 1 on such a spec,
    # before any rank: fixed since, see runtime/muralist_runtime/launch.py).
    proc = subprocess.run([sys.executable, "-m", contract.RUNTIME_MODULE, "--spec", str(spec_file)],
                          env={**baseline_env(runtime_env, baseline_tree),
                               contract.MURALIST_TERMINATION_LOG: str(termination)},
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == contract.PERMANENT_FAILURE_EXIT_CODE, proc.stderr[-3000:]
    verdict = json.loads(termination.read_text())
    assert verdict["reason"] == "PermanentFailure" and verdict["message"].startswith("spec.generation.futureGuard")
