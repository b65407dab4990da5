from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from muralist_cli import main

from tests.builders import make_job
from tests.paths import REPO
from tests.unit.api.rules.invalid_cases import INVALID_CASES

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def run_cli(*args: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr, sys.stdin = out, err, io.StringIO(stdin)
    try:
        code = main(list(args))
    finally:
        sys.stdout, sys.stderr, sys.stdin = old
    return code, out.getvalue(), err.getvalue()


def test_every_example_is_valid() -> None:
    assert len(EXAMPLES) >= 7
    code, out, err = run_cli("validate", *map(str, EXAMPLES))
    assert (code, err) == (0, "")
    assert len(out.splitlines()) == len(EXAMPLES)


@pytest.mark.parametrize(
    ("manifest", "field"), [(m, f) for _, m, f, _ in INVALID_CASES], ids=[c[0] for c in INVALID_CASES]
)
def test_invalid_manifest_names_its_field(manifest: dict, field: str, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    code, out, err = run_cli("validate", str(path))
    assert code == 1
    assert out == ""
    assert field in err, err
    assert "Traceback" not in err


def test_valid_job_summary_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(make_job().context_parallel(ulysses=2).world(nodes=2, gpus=4).obj()))
    code, out, _ = run_cli("validate", str(path))
    assert code == 0
    assert out.strip() == ("cats: valid (ContextParallel, world size 8, data-parallel degree 4, 2 images)")


def test_summary_line_of_a_dataset_job(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    job = make_job().drop("spec.prompts").set("spec.dataset", {"volume": {"emptyDir": {}}, "path": "rows.jsonl"})
    path.write_text(yaml.safe_dump(job.obj()))
    code, out, err = run_cli("validate", str(path))
    assert (code, err) == (0, "")
    assert out.strip() == ("cats: valid (DataParallel, world size 1, data-parallel degree 1, 1 per row of dataset "
                           "rows.jsonl)")


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path) -> None:
    manifest = make_job(name="Bad").generation(stepz=1).output(path="/abs").obj()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    _, _, err = run_cli("validate", str(path))
    for field in ("metadata.name", "spec.generation.stepz", "spec.output.path"):
        assert field in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: [\n", "not valid YAML at line 2"),
        ("apiVersion: v1\nkind: ConfigMap\n", "no DiffusionJob found"),
        ("apiVersion: muralist.dev/v1\nkind: DiffusionJob\nmetadata: {name: x}\n", "expected muralist.dev/v1alpha1"),
        ("- just\n- a list\n", "no DiffusionJob found"),
        ("", "no DiffusionJob found (got nothing)"),
    ],
)
def test_malformed_input_from_stdin(text: str, expected: str) -> None:
    code, _, err = run_cli("validate", "-", stdin=text)
    assert code == 1
    assert expected in err
    assert "Traceback" not in err


def test_missing_file_is_reported(tmp_path: Path) -> None:
    code, _, err = run_cli("validate", str(tmp_path / "nope.yaml"))
    assert code == 1 and "cannot read" in err


def test_multi_document_reports_each_job(tmp_path: Path) -> None:
    good = make_job(name="good").obj()
    bad = make_job(name="bad").generation(steps=0).obj()
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all([good, bad]))
    code, out, err = run_cli("validate", str(path))
    assert code == 1
    assert out.startswith("good: valid")
    assert "#1 (bad): spec.generation.steps" in err


def test_console_script_has_no_traceback_on_garbage(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("{{{{")
    proc = subprocess.run(
        [sys.executable, "-m", "muralist_cli", "validate", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "not valid YAML" in proc.stderr
