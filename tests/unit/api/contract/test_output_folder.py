"""The output folder's contract (muralist_api/contract/output_folder.py): its names spelled there alone, its
patterns read back, and job.json as `JobRecord`, read from every version and written byte for byte as before."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from muralist_api.contract import output_folder
from muralist_api.contract.output_folder import Chunks, JobRecord
from muralist_api.contract.output_format import FormatError, NewerFormat, read_job_record

from tests.paths import FIXTURES, REPO

PRODUCT = [REPO / "api" / "muralist_api", REPO / "operator" / "muralist_operator",
           REPO / "runtime" / "muralist_runtime", REPO / "cli" / "muralist", REPO / "cli" / "muralist_cli"]
CONTRACT = REPO / "api" / "muralist_api" / "contract" / "output_folder.py"
# The folder's names of the "Done when": not even prose (a docstring, a comment, a description) spells
# them outside the contract; prose says "the job file", "the manifest", "the index".
SPELLED_ONCE = ("job.json", "manifest.jsonl", "index.parquet")
# Every other name and pattern of the folder: no code builds a path of it outside the contract. A string
# literal (not a docstring) holding one is a path when it has no space, or joins it to a path (`{where}/...`).
NAMED_IN_CODE = (*SPELLED_ONCE, "cache-off.json", "index.html", "summary.js", "chunk-", "shard-", "page-", "images/",
                 "shards/", "parts/", "gallery/")


def product_files() -> list[Path]:
    return sorted(p for root in PRODUCT for p in root.rglob("*.py") if "__pycache__" not in p.parts and p != CONTRACT)


def test_the_folder_names_of_the_done_list_are_spelled_in_the_contract_alone() -> None:
    found = [f"{p.relative_to(REPO)}:{n}: {name}" for p in product_files()
             for n, line in enumerate(p.read_text().splitlines(), 1) for name in SPELLED_ONCE if name in line]
    assert not found, f"say it through contract/output_folder.py (JOB_FILE, ...) or as 'the job file': {found}"
    assert all(f'"{name}"' in CONTRACT.read_text() for name in SPELLED_ONCE)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def path_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of the string literals of `source` that build a path of the folder's names."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            parts = [node.value]
        else:
            continue
        text = "".join(str(p) for p in parts)
        for name in NAMED_IN_CODE:
            if name in text and (not re.search(r"\s", text) or re.search(rf"[/}}]{re.escape(name)}", text)):
                found.append((node.lineno, text))
    return found


def test_no_product_code_builds_a_path_of_the_folder_outside_the_contract() -> None:
    found = [f"{p.relative_to(REPO)}:{line}: {text!r}" for p in product_files()
             for line, text in path_literals(p.read_text())]
    assert not found, f"use contract/output_folder.py's names and patterns: {found}"


def test_the_literal_check_tells_a_path_from_prose() -> None:
    code = '''"""Reads job.json, then parts/chunk-000001.jsonl."""
a = "job.json"
b = f"{root}/manifest.jsonl is not one"
c = name.startswith("chunk-")
d = "the cache is off (cache-off.json in the folder says which)"
'''
    assert [line for line, _ in path_literals(code)] == [2, 3, 4]


def test_the_patterns_read_back() -> None:
    assert output_folder.part_file(12) == "parts/chunk-000012.jsonl"
    assert output_folder.part_number(output_folder.part_name(12)) == 12
    assert output_folder.part_number(".chunk-000012.jsonl.host-1.tmp") is None, "a temp is no part file"
    assert output_folder.shard_file(3) == "shards/shard-000003.tar"
    assert output_folder.shard_number(output_folder.shard_file(3)) == 3
    assert output_folder.shard_number("shard-000003.tar") == 3
    assert output_folder.page_number(output_folder.page_name(100_000)) == 100_000, "more than five digits past 99,999"
    assert output_folder.page_number("summary.js") is None
    assert output_folder.item_file("00001-000", "png") == "images/00001-000.png"
    assert output_folder.record_file("00001-000") == "images/00001-000.json"
    assert output_folder.still_file("00001-000", "poster") == "images/00001-000.poster.jpg"


FORMAT_FIXTURES = sorted(p.parent.name for p in (FIXTURES / "formats").glob("*/job.json"))


@pytest.mark.parametrize("name", FORMAT_FIXTURES)
def test_every_older_versions_job_file_reads_as_a_record(name: str) -> None:
    raw = json.loads((FIXTURES / "formats" / name / "job.json").read_text())
    record = read_job_record(raw)
    assert record.name == raw["name"] and record.spec_digest == raw["specDigest"]
    assert record.output.format == raw["spec"]["spec"]["output"]["format"] == "png"
    assert record.output.layout == name.rpartition("-")[2]
    assert (record.plan is not None) == (record.output_format is not None) == name.startswith("7266f35")
    assert record.digest_version == raw.get("digestVersion") and not record.merged
    assert record.model_dump(by_alias=True, mode="json", exclude_unset=True) == raw, "read as written"


def merged_job_file() -> dict[str, object]:
    """A job file as the runtime wrote it at the merge before the record was a model: its fields in this
    order, the summary's None values kept, the timings last."""
    raw = json.loads((FIXTURES / "formats" / "7266f35-files" / "job.json").read_text())
    return {**raw, "cacheCalibration": {"ratios": [1.0, 0.9]}, "items": {"rendered": 16, "skipped": 2},
            "cacheVerify": {"sampled": 0, "identical": 0, "minPsnr": None, "thresholds": {}, "verdict": "measured"},
            "loadSeconds": 1.146, "firstItemSeconds": 4.093, "peakMemoryMiB": 812}


def test_a_record_is_written_byte_for_byte_as_the_runtime_wrote_job_json() -> None:
    doc = merged_job_file()
    record = JobRecord.model_validate(doc)
    assert record.to_text() == json.dumps(doc, indent=2) + "\n"
    assert record.merged and record.items == {"rendered": 16, "skipped": 2}
    assert record.timings == {"loadSeconds": 1.146, "firstItemSeconds": 4.093, "peakMemoryMiB": 812}
    assert record.plan == Chunks(0, 1)


def test_fields_a_newer_version_adds_are_kept() -> None:
    record = read_job_record({**merged_job_file(), "someFutureSummary": {"x": 1}})
    assert json.loads(record.to_text())["someFutureSummary"] == {"x": 1}


@pytest.mark.parametrize(("change", "why"), [
    ({"outputFormat": "4"}, "records outputFormat '4', which no Muralist version writes"),
    ({"outputFormat": True}, "records outputFormat True, which no Muralist version writes"),
    ({"outputFormat": 0}, "records outputFormat 0, which no Muralist version writes"),
    ({"plan": {"firstRow": -1, "chunkRows": 2}}, "records a plan {'firstRow': -1, 'chunkRows': 2}, not "),
    ({"items": {"rendered": "all"}}, "records items {'rendered': 'all'}, which no Muralist version writes"),
])
def test_a_job_file_no_version_wrote_is_refused_by_field(change: dict[str, object], why: str) -> None:
    with pytest.raises(FormatError) as refused:
        read_job_record({**merged_job_file(), **change})
    assert str(refused.value).startswith(why) and not isinstance(refused.value, NewerFormat)


def test_a_newer_versions_job_file_is_its_own_refusal() -> None:
    with pytest.raises(NewerFormat, match="by a newer Muralist version"):
        read_job_record({**merged_job_file(), "outputFormat": 99})
    with pytest.raises(FormatError, match="not a JSON object but list"):
        read_job_record([])
