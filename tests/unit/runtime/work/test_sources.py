"""Streaming row sources: every format, detection, folders, ranges, bad rows, forward skipping."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from muralist_runtime.work.sources import Columns, MissingColumn, Row, RowSource, SourceError, detect, readers, source

PROMPTS = [f"a photo of item {i}" for i in range(50)]


def write_jsonl(path: Path, records: list[dict], blank_every: int = 0) -> Path:
    lines = []
    for i, r in enumerate(records):
        lines.append(json.dumps(r))
        if blank_every and i % blank_every == 0:
            lines.append("   ")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_csv(path: Path, header: list[str], rows: list[list], blank_every: int = 0) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for i, r in enumerate(rows):
        w.writerow(r)
        if blank_every and i % blank_every == 0:
            buf.write("\r\n")
    path.write_text(buf.getvalue(), newline="")
    return path


def write_parquet(path: Path, table: dict, row_group_size: int = 7) -> Path:
    pq.write_table(pa.table(table), path, row_group_size=row_group_size)
    return path


def save_hf(path: Path, data: dict, features=None) -> Path:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_dict(data, features=features).save_to_disk(str(path))
    return path


def prompts(rows) -> list[str]:
    return [r.prompt for r in rows]


@pytest.fixture
def every_format(tmp_path: Path) -> dict[str, Path]:
    """The same 50 prompts in each format, with blank lines where the format has lines."""
    d = tmp_path / "formats"
    d.mkdir()
    text = "\n".join(p + ("\n\n  \t" if i % 5 == 0 else "") for i, p in enumerate(PROMPTS))
    (d / "p.txt").write_text(text)  # no final newline
    return {
        "text": d / "p.txt",
        "jsonl": write_jsonl(d / "p.jsonl", [{"prompt": p} for p in PROMPTS], blank_every=4),
        "csv": write_csv(d / "p.csv", ["prompt"], [[p] for p in PROMPTS], blank_every=6),
        "parquet": write_parquet(d / "p.parquet", {"prompt": PROMPTS}),
        "hf": save_hf(d / "hf", {"prompt": PROMPTS}),
    }


@pytest.mark.parametrize("fmt", ["text", "jsonl", "csv", "parquet", "hf"])
def test_every_format_reads_any_sequence_of_ranges(every_format: dict[str, Path], fmt: str) -> None:
    src = RowSource(every_format[fmt])
    assert src.format == fmt
    assert src.count() == 50
    # Forward claims, an empty range, one past the end, and going back to the start.
    for begin, end in [(0, 3), (3, 10), (12, 12), (13, 29), (40, 45), (45, 60), (48, 100), (2, 5), (0, 50)]:
        got = list(src.rows(begin, end))
        assert prompts(got) == PROMPTS[begin:end], (begin, end)
        assert [r.index for r in got] == list(range(begin, min(end, 50)))
        assert all(r.ok for r in got)
    src.close()


def test_row_range_of_the_source_clips_every_request(every_format: dict[str, Path]) -> None:
    src = RowSource(every_format["jsonl"], start=10, end=20)
    assert src.count() == 10
    assert [r.index for r in src.rows(0, 13)] == [10, 11, 12]
    assert [r.index for r in src.rows(18, 99)] == [18, 19]
    assert list(src.rows(20, 30)) == []
    assert RowSource(every_format["parquet"], start=45).count() == 5
    assert RowSource(every_format["text"], start=60).count() == 0
    with pytest.raises(SourceError, match="bad row range"):
        RowSource(every_format["text"], start=5, end=2)


def test_column_mapping_and_conversions(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [
        {"caption": "a cat", "neg": "blurry", "s": 7, "img": "in/1.png", "m": "in/1-mask.png", "str": 0.6, "uid": 11},
        {"caption": "a dog", "neg": "", "s": "8", "img": "in/2.png", "m": "in/2-mask.png", "str": "1", "uid": "b"},
        {"caption": "a cow", "s": 9.0, "img": "in/3.png", "m": "in/3-mask.png"},
    ])
    cols = Columns(prompt="caption", negative_prompt="neg", seed="s", image="img", mask="m", strength="str", id="uid")
    rows = list(RowSource(path, columns=cols).rows(0, 10))
    assert rows[0] == Row(index=0, id="11", prompt="a cat", negative_prompt="blurry", seed=7, image="in/1.png",
                          mask="in/1-mask.png", strength=0.6)
    assert (rows[1].negative_prompt, rows[1].seed, rows[1].strength, rows[1].id) == (None, 8, 1.0, "b")
    assert (rows[2].seed, rows[2].strength, rows[2].id, rows[2].error) == (9, None, None, None)


def test_size_columns_give_each_row_its_own_size(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "sizes.jsonl", [
        {"p": "a", "h": 64, "w": 32, "f": 17}, {"p": "b", "w": 64}, {"p": "c", "h": 48.0, "w": "96", "f": 9},
        {"p": "d", "h": 60, "w": 64}, {"p": "e", "h": 64, "f": 0}, {"p": "f", "f": 2000},
    ])
    rows = list(RowSource(path, columns=Columns(prompt="p", height="h", width="w", num_frames="f")).rows(0, 9))
    assert [(r.height, r.width, r.num_frames) for r in rows[:3]] == [(64, 32, 17), (None, 64, None), (48, 96, 9)]
    assert [r.error for r in rows[3:]] == ["column 'h': height 60 is not a multiple of 8 in 8..16384",
                                           "column 'f': numFrames 0 is outside 1..1025",
                                           "column 'f': numFrames 2000 is outside 1..1025"], "a bad size fails its row"


def test_image_only_source_needs_no_prompt(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "i.csv", ["file"], [["a.png"], ["b.png"]])
    rows = list(RowSource(path, columns=Columns(prompt=None, image="file")).rows(0, 5))
    assert [(r.prompt, r.image, r.ok) for r in rows] == [("", "a.png", True), ("", "b.png", True)]
    with pytest.raises(SourceError, match="neither is set"):
        RowSource(path, columns=Columns(prompt=None))


def test_bad_rows_are_failed_items_not_exceptions(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": "fine", "seed": 1}),
        "{not json",
        json.dumps(["a", "list"]),
        json.dumps({"text": "no prompt key", "id": "x7"}),
        json.dumps({"prompt": "   "}),
        json.dumps({"prompt": "p", "seed": "twelve"}),
        json.dumps({"prompt": "p", "seed": 1.5}),
        json.dumps({"prompt": "p", "seed": -3}),
        json.dumps({"prompt": "p", "seed": True}),
        json.dumps({"prompt": 42}),
        json.dumps({"prompt": "p", "strength": 3}),
        json.dumps({"prompt": "also fine"}),
    ]) + "\n")
    rows = list(RowSource(path, columns=Columns(seed="seed", strength="strength", id="id")).rows(0, 100))
    assert [r.index for r in rows] == list(range(12))
    assert [r.ok for r in rows] == [True] + [False] * 10 + [True]
    errors = [r.error for r in rows[1:11]]
    for error, needle in zip(errors, ["not valid JSON", "JSON list, not an object", "'prompt': missing",
                                      "empty prompt", "'twelve' is not an integer", "1.5 is not an integer",
                                      "outside 0..2^63-1", "True is not an integer", "int, not a string",
                                      "outside 0..1"], strict=True):
        assert needle in error
    assert all(r.prompt == "" for r in rows[1:11])
    assert rows[3].id == "x7", "a failed row keeps its id when it has a valid one"


def test_csv_quoted_newlines_stray_quotes_and_field_counts(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    path.write_text('prompt,seed\n"a cat\non two lines",1\n\na 5" statue,2\nunquoted, comma,3\n"say ""hi""",4\n',
                    newline="")
    src = RowSource(path, columns=Columns(seed="seed"))
    assert src.count() == 4, "the quoted newline is inside a row; the blank line is not a row"
    rows = list(src.rows(0, 10))
    assert [(r.prompt, r.seed) for r in rows if r.ok] == [("a cat\non two lines", 1), ('a 5" statue', 2),
                                                          ('say "hi"', 4)]
    assert "3 fields, the header has 2" in rows[2].error
    assert [r.prompt for r in src.rows(3, 4)] == ['say "hi"']


SCHEMA = {"uid": ["u1", "u2"], "caption": ["x", "y"], "seed": [1, 2]}


def write_schema(tmp_path: Path, fmt: str) -> Path:
    """Two rows with the columns uid, caption, seed in each format."""
    rows = [dict(zip(SCHEMA, values, strict=True)) for values in zip(*SCHEMA.values(), strict=True)]
    return {"jsonl": lambda: write_jsonl(tmp_path / "s.jsonl", rows),
            "csv": lambda: write_csv(tmp_path / "s.csv", list(SCHEMA), [list(r.values()) for r in rows]),
            "parquet": lambda: write_parquet(tmp_path / "s.parquet", SCHEMA),
            "hf": lambda: save_hf(tmp_path / "hf", SCHEMA)}[fmt]()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "hf"])
def test_a_column_missing_from_the_schema_raises_naming_what_exists(tmp_path: Path, fmt: str) -> None:
    with pytest.raises(MissingColumn, match=r"no column 'prompt'; columns: uid, caption, seed$") as raised:
        RowSource(write_schema(tmp_path, fmt))
    assert (raised.value.column, raised.value.found) == ("prompt", list(SCHEMA))


def test_json_lines_columns_are_the_keys_of_its_first_rows(tmp_path: Path) -> None:
    # JSON Lines has no header: a key that only some rows have (seed here) is a column all the
    # same, and a line that is not an object does not hide the others' keys.
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b", "seed": 3}])
    path.write_text("{not json\n" + path.read_text())
    assert [(r.prompt, r.seed) for r in RowSource(path, columns=Columns(seed="seed")).rows(0, 9) if r.ok] == [
        ("a", None), ("b", 3)]
    late = write_jsonl(tmp_path / "late.jsonl",
                       [{"prompt": "a"}] * readers.SCHEMA_ROWS + [{"prompt": "b", "negative": "blurry"}])
    with pytest.raises(MissingColumn, match=r"no column 'negative'; columns: prompt$"):
        RowSource(late, columns=Columns(negative_prompt="negative"))
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("{not json\n[1]\n")  # no object to learn the keys from: the rows fail one by one
    assert [r.ok for r in RowSource(only_bad).rows(0, 9)] == [False, False]


def test_detection_by_extension_and_folder_contents(tmp_path: Path, every_format: dict[str, Path]) -> None:
    for fmt, path in every_format.items():
        assert detect(path)[0] == fmt
    (tmp_path / "x.yaml").write_text("a: 1\n")
    with pytest.raises(SourceError, match=r"x\.yaml: cannot tell the format .*set the format explicitly"):
        detect(tmp_path / "x.yaml")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.jsonl").write_text('{"prompt": "a"}\n')
    (mixed / "b.csv").write_text("prompt\nb\n")
    with pytest.raises(SourceError, match=r"mixed.*mixed formats \['csv', 'jsonl'\]"):
        RowSource(mixed)
    (mixed / "b.csv").unlink()
    (mixed / "notes.md").write_text("hi")
    with pytest.raises(SourceError, match=r"cannot tell the format of \['notes.md'\]"):
        RowSource(mixed)
    # An explicit format reads extensionless part files; dot- and underscore-files are skipped.
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-0").write_text('{"prompt": "p0"}\n')
    (parts / "part-1").write_text('{"prompt": "p1"}\n')
    (parts / "_SUCCESS").write_text("")
    (parts / ".part-2.tmp").write_text("junk")
    assert prompts(RowSource(parts, fmt="jsonl").rows(0, 9)) == ["p0", "p1"]
    with pytest.raises(SourceError, match="unknown format 'xml'"):
        RowSource(parts, fmt="xml")
    with pytest.raises(SourceError, match="no such file"):
        RowSource(tmp_path / "nope.jsonl")


def test_whole_file_problems_say_what_to_do(tmp_path: Path, every_format: dict[str, Path]) -> None:
    (tmp_path / "arr.json").write_text('[{"prompt": "a"}]')
    with pytest.raises(SourceError, match=r"a JSON array, not JSON Lines.*jq -c"):
        RowSource(tmp_path / "arr.json")
    with pytest.raises(SourceError, match="text source has one prompt per line"):
        RowSource(every_format["text"], columns=Columns(seed="seed"))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(SourceError, match="no header row"):
        RowSource(tmp_path / "empty.csv")
    import datasets

    dd = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"prompt": ["a"]})}).save_to_disk(str(dd))
    with pytest.raises(SourceError, match=r"DatasetDict with splits \['train'\]; point the source at one split"):
        RowSource(dd)


def test_folder_is_the_files_concatenated_in_name_order(tmp_path: Path) -> None:
    d = tmp_path / "shards"
    d.mkdir()
    sizes = {"c.jsonl": 4, "a.jsonl": 3, "b.jsonl": 0, "d.jsonl": 5}  # read as a, b, c, d
    expected = []
    for name in sorted(sizes):
        records = [{"prompt": f"{name}-{i}"} for i in range(sizes[name])]
        write_jsonl(d / name, records)
        expected += [r["prompt"] for r in records]
    src = RowSource(d)
    assert src.count() == 12
    assert prompts(src.rows(2, 8)) == expected[2:8], "a range across files, over an empty one"
    assert prompts(src.rows(11, 20)) == expected[11:]
    assert prompts(src.rows(0, 1)) == expected[:1]
    for fmt in ("csv", "parquet"):
        f = tmp_path / fmt
        f.mkdir()
        for k in range(3):
            rows = [f"{fmt}{k}-{i}" for i in range(k + 2)]
            if fmt == "csv":
                write_csv(f / f"{k}.csv", ["prompt"], [[p] for p in rows])
            else:
                write_parquet(f / f"{k}.parquet", {"prompt": rows}, row_group_size=2)
        src = RowSource(f)
        assert src.count() == 9
        assert prompts(src.rows(1, 6)) == [f"{fmt}0-1", f"{fmt}1-0", f"{fmt}1-1", f"{fmt}1-2", f"{fmt}2-0"]


def test_count_stops_at_the_end_of_the_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "f"
    d.mkdir()
    for k in range(4):
        write_jsonl(d / f"{k}.jsonl", [{"prompt": "p"}] * 10)
    opened = []
    real = source._LineReader
    monkeypatch.setattr(source, "_LineReader", lambda path, *a: opened.append(path.name) or real(path, *a))
    assert RowSource(d, end=15).count() == 15
    assert opened == ["0.jsonl", "0.jsonl", "1.jsonl"], "the construction check, then only the files it needs"


def test_hf_image_feature_comes_out_as_bytes_undecoded(tmp_path: Path) -> None:
    import datasets
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (2, 2), (1, 2, 3)).save(png, format="PNG")
    features = datasets.Features({"prompt": datasets.Value("string"), "image": datasets.Image()})
    path = save_hf(tmp_path / "img", {"prompt": ["a", "b"], "image": [{"bytes": png.getvalue(), "path": None}] * 2},
                   features)
    rows = list(RowSource(path, columns=Columns(image="image")).rows(1, 2))
    assert rows[0].image == png.getvalue()
    assert rows[0].prompt == "b"


def test_parquet_binary_image_column(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "b.parquet", {"prompt": ["a", "b"], "image": [b"\x89PNG...", b""]})
    rows = list(RowSource(path, columns=Columns(image="image")).rows(0, 2))
    assert rows[0].image == b"\x89PNG..."
    assert "empty image bytes" in rows[1].error


@pytest.mark.parametrize("block", [7, 64, 1 << 20])
def test_line_scanner_agrees_with_reading_across_block_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  block: int) -> None:
    monkeypatch.setattr(readers, "BLOCK", block)
    lines = ["\ufeffp0", "", "p1", "  \t ", "p2\r", "\r", "", "p3 with a longer line than one block", "p4", "  p5  "]
    path = tmp_path / "l.txt"
    path.write_bytes("\n".join(lines).encode())  # a BOM, CRLF, whitespace lines, no final newline
    expected = ["p0", "p1", "p2", "p3 with a longer line than one block", "p4", "p5"]
    src = RowSource(path)
    assert src.count() == 6
    for k in range(7):
        assert prompts(src.rows(k, 7)) == expected[k:]
        assert prompts(RowSource(path).rows(k, k + 1)) == expected[k:k + 1]


def test_forward_skips_parse_no_skipped_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path / "big.jsonl", [{"prompt": f"p{i}"} for i in range(20_000)], blank_every=100)
    opened = []
    real_reader = source._LineReader
    monkeypatch.setattr(source, "_LineReader", lambda path, *a: opened.append(1) or real_reader(path, *a))
    src = RowSource(path)
    decoded = []
    real_loads = json.loads
    monkeypatch.setattr(readers.json, "loads", lambda s, *a, **k: decoded.append(1) or real_loads(s, *a, **k))

    assert prompts(src.rows(15_000, 15_003)) == ["p15000", "p15001", "p15002"]
    assert len(decoded) == 3, "the 15,000 rows before were skipped by a byte scan"
    assert prompts(src.rows(19_998, 20_100)) == ["p19998", "p19999"]
    assert len(decoded) == 5
    assert len(opened) == 2, "construction, then one cursor kept across forward claims"
    assert prompts(src.rows(10, 12)) == ["p10", "p11"], "going backwards reopens"
    assert (len(opened), len(decoded)) == (3, 7)


class _Counted:
    """A binary file that adds the bytes read through it to `read[0]`."""

    def __init__(self, f, read: list[int]):
        self._f, self._read = f, read

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._read[0] += len(data)
        return data

    def __getattr__(self, name: str):
        return getattr(self._f, name)


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_after_the_count_a_seek_reads_about_one_block_not_the_file_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    monkeypatch.setattr(readers, "BLOCK", 4096)
    folder = tmp_path / "rows"
    folder.mkdir()
    first = [{"prompt": f"p{i}"} for i in range(7_000)]
    second = [{"prompt": f"p{i}"} for i in range(7_000, 20_000)]
    if fmt == "jsonl":
        write_jsonl(folder / "a.jsonl", first, blank_every=97)
        write_jsonl(folder / "b.jsonl", second, blank_every=89)
    else:
        lines = [r["prompt"] + ("\n\n" if i % 97 == 0 else "\n") for i, r in enumerate(first)]  # blank lines too
        (folder / "a.txt").write_text("".join(lines))
        (folder / "b.txt").write_text("".join(r["prompt"] + "\n" for r in second))
    read = [0]
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: _Counted(real_open(self, *a, **k), read))
    src = RowSource(folder)
    assert src.count() == 20_000
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size <= read[0] < size + 3 * 4096, "the count reads each file once"
    # Claims in increasing order, as ranks take them, each far past the last: and one backwards.
    for begin in (15_000, 2_500, 19_990, 6_999, 11_111):
        read[0] = 0
        assert prompts(src.rows(begin, begin + 3)) == [f"p{i}" for i in range(begin, min(begin + 3, 20_000))]
        assert read[0] <= 3 * 4096, f"rows from {begin}: read {read[0]} bytes of {size}"


def test_parquet_skips_whole_row_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_parquet(tmp_path / "g.parquet", {"prompt": [f"p{i}" for i in range(1000)]}, row_group_size=100)
    calls = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        calls.append(kwargs["row_groups"][0])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    src = RowSource(path)
    assert prompts(src.rows(950, 952)) == ["p950", "p951"]
    assert prompts(src.rows(980, 981)) == ["p980"]
    assert calls == [9], "started at row group 9; the next claim in that group reuses the reader"
    assert prompts(src.rows(120, 121)) == ["p120"]
    assert calls == [9, 1]


def test_a_new_rows_call_invalidates_the_previous_iterator(every_format: dict[str, Path]) -> None:
    src = RowSource(every_format["jsonl"])
    first = src.rows(0, 10)
    assert next(first).index == 0
    second = src.rows(20, 22)
    assert [r.index for r in second] == [20, 21]
    with pytest.raises(RuntimeError, match="called again"):
        next(first)


# -- the job's view: a mapped column the source lacks fails the job before any item ---------------

def dataset_runtime(root: Path, path: str, **columns: str):
    from muralist_api.runtime_spec import RuntimeSpec

    from tests.builders import make_job

    volume = {"hostPath": {"path": str(root)}}
    spec = make_job().drop("spec.prompts").set("spec.dataset", {"volume": volume, "path": path, "columns": columns})
    if {"image", "mask"} & set(columns):  # input images: a pipeline that takes them, a volume that holds them
        spec.set("spec.model.pipeline", "FluxInpaintPipeline").set("spec.inputs", {"volume": volume})
    spec = spec.obj()["spec"]
    return RuntimeSpec.model_validate({"name": "t", "spec": spec, "outputDir": "/unused", "datasetDir": str(root)})


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "hf"])
@pytest.mark.parametrize("field", ["prompt", "negativePrompt", "seed", "id", "image", "mask", "strength"])
def test_every_mapped_column_is_checked_against_the_schema_in_every_format(tmp_path: Path, fmt: str,
                                                                          field: str) -> None:
    from muralist_api.contract import PermanentFailure
    from muralist_runtime.work import rows

    path = write_schema(tmp_path, fmt)
    columns = {"prompt": "caption", field: "text"}
    with pytest.raises(PermanentFailure) as raised:
        rows.open_rows(dataset_runtime(tmp_path, path.name, **columns))
    assert str(raised.value) == f"spec.dataset.columns.{field}: no column 'text'; columns: uid, caption, seed"


def test_a_folder_names_the_file_that_lacks_a_column(tmp_path: Path) -> None:
    from muralist_api.contract import PermanentFailure
    from muralist_runtime.work import rows

    folder = tmp_path / "parts"
    folder.mkdir()
    write_csv(folder / "a.csv", ["text"], [["x"], ["y"]])
    write_csv(folder / "b.csv", ["caption"], [["z"]])
    assert rows.open_rows(dataset_runtime(tmp_path, "parts/a.csv", prompt="text")).count() == 2
    # Counting opens every file of the range: a later file is checked before any item too.
    with pytest.raises(PermanentFailure, match=r"^spec.dataset.columns.prompt: no column 'text' in b.csv; "
                                               r"columns: caption$"):
        rows.open_rows(dataset_runtime(tmp_path, "parts", prompt="text"))
