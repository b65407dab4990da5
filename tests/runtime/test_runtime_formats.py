"""Output folders of every earlier output format resume with today's runtime, and a folder of a
newer format is refused (the contract in api/muralist_api/contract/output_format.py).

The folders are frozen fixtures that the old commits wrote themselves (tests/fixtures/formats/:
fixtures.json says which commit, how it was stopped and what was removed; make_fixtures.py made
them): partial jobs, as a killed pod leaves them. Each is resumed by one runtime process, as a
one-process pod's worker runs (torchrun's agent adds seconds, and nothing a resume reads); a
fixture that reads exactly as another (`sameAs`) is left to the unit tests.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from muralist_api import contract
from muralist_runtime.outputs import shards

from tests.operator_helpers import free_port
from tests.runtime.conftest import Run, runtime_spec_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "formats"
RECORD: list[dict[str, Any]] = json.loads((FIXTURES / "fixtures.json").read_text())["fixtures"]
RESUMED = [f for f in RECORD if not f.get("sameAs")]

pytestmark = pytest.mark.torchrun


def run_runtime(spec_json: str, output: Path, env: dict[str, str]) -> Run:
    """The runtime as one process (world of one): `python -m muralist_runtime --spec FILE`."""
    spec_file = output.parent / f"{output.name}.spec.json"
    spec_file.write_text(spec_json)
    term = output.parent / f"{output.name}.termination"
    env = {**env, contract.MURALIST_TERMINATION_LOG: str(term),
           contract.MURALIST_PROGRESS_DIR: str(output.parent / f"{output.name}.progress"),
           contract.MURALIST_CLAIMS_ADDR: f"127.0.0.1:{free_port()}"}
    done = subprocess.run([sys.executable, "-m", "muralist_runtime", "--spec", str(spec_file)], env=env,
                          capture_output=True, text=True, timeout=240)
    return Run(done.returncode, done.stdout, done.stderr, output, json.loads(term.read_text()))


def fixture_copy(fixture: dict[str, Any], tmp_path: Path) -> tuple[Path, str]:
    """A writable copy of the fixture's folder (mtimes kept), and the RuntimeSpec of its job."""
    out = tmp_path / "out"
    shutil.copytree(FIXTURES / fixture["name"], out)
    job = yaml.safe_load((FIXTURES / fixture["job"]).read_text())
    return out, runtime_spec_json(job["spec"], out, name=job["metadata"]["name"])


def untouchable(out: Path, fixture: dict[str, Any]) -> dict[str, tuple[bytes, int]]:
    """Every file the old run left that a resume must keep as it is, with its bytes and mtime: all
    but job.json (rewritten), the JSON of an item whose image is missing (rendered again) and the part
    files (relisted: their items' statuses say what this run did with them; `listed` compares the rest)."""
    redo = {f"images/{key}.json" for key in fixture["items"] if key not in fixture["complete"]}
    files = [p for p in out.rglob("*") if p.is_file()]
    return {str(rel): (p.read_bytes(), p.stat().st_mtime_ns) for p in files
            if (rel := p.relative_to(out).as_posix()) != "job.json" and rel not in redo
            and not rel.startswith("parts/")}


def listed(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Each part file's entries but their statuses (a resume lists what it kept as "skipped")."""
    return {p.name: [{k: v for k, v in json.loads(line).items() if k != "status"}
                     for line in p.read_text().splitlines()] for p in sorted((out / "parts").glob("*.jsonl"))}


def items_on_disk(out: Path, layout: str) -> Counter[str]:
    if layout == "files":
        images = out / "images"
        return Counter(p.stem for p in images.glob("*.png") if (images / f"{p.stem}.json").is_file())
    return Counter(key for shard in sorted((out / "shards").glob("shard-*.tar")) for key, _ in shards.read_shard(shard))


@pytest.mark.parametrize("fixture", RESUMED, ids=[f["name"] for f in RESUMED])
def test_a_folder_of_an_earlier_output_format_resumes(fixture: dict[str, Any], tmp_path: Path, runtime_env,
                                                      tiny_model: Path) -> None:
    out, spec = fixture_copy(fixture, tmp_path)
    before = untouchable(out, fixture)
    parts_before = listed(out) if (out / "parts").is_dir() else {}
    items, complete = fixture["items"], set(fixture["complete"])
    missing = [key for key in items if key not in complete]

    run = run_runtime(spec, out, runtime_env)

    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(e["key"] for e in run.events("completed")) == missing, "only the missing items are rendered"
    after = {name: (p.read_bytes(), p.stat().st_mtime_ns) for name in before if (p := out / name).is_file()}
    changed = sorted(name for name in before if after.get(name) != before[name])
    assert not changed, f"files the old run made were rewritten or lost: {changed}"
    parts_after = listed(out)
    assert {name: parts_after.get(name) for name in parts_before} == parts_before, "parts list the same items"
    assert items_on_disk(out, fixture["layout"]) == Counter(items), "every item on disk, once"
    manifest = run.manifest()
    assert [m["key"] for m in manifest] == items, "the manifest lists every item once, in order"
    assert [m["index"] for m in manifest] == list(range(len(items)))
    assert {m["status"] for m in manifest} <= {"rendered", "skipped"}
    assert [r["key"] for r in shards.read_index(out / "index.parquet")] == items

    from muralist_api.contract.output_format import OUTPUT_FORMAT

    assert json.loads((out / "job.json").read_text())["outputFormat"] == OUTPUT_FORMAT


def test_a_folder_of_a_newer_output_format_is_refused(tmp_path: Path, runtime_env, tiny_model: Path) -> None:
    from muralist_api.contract.output_format import OUTPUT_FORMAT

    fixture = RESUMED[-1]
    out, spec = fixture_copy(fixture, tmp_path)
    job = json.loads((out / "job.json").read_text())
    (out / "job.json").write_text(json.dumps({**job, "outputFormat": OUTPUT_FORMAT + 1}))
    before = untouchable(out, fixture)

    run = run_runtime(spec, out, runtime_env)

    assert run.returncode == contract.PERMANENT_FAILURE_EXIT_CODE, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    message = run.termination["message"]
    assert message.startswith(f"spec.output.path: {out} was written in output format {OUTPUT_FORMAT + 1} by a "
                              f"newer Muralist version; this one writes format {OUTPUT_FORMAT}"), message
    assert f"muralist: {message}" in run.stderr
    assert {name: ((out / name).read_bytes(), (out / name).stat().st_mtime_ns) for name in before} == before
    assert not (out / "manifest.jsonl").exists()
