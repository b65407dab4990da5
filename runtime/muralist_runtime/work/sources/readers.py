"""One file of a source, read forward only: JSON Lines and text, CSV, Parquet, saved datasets.

Each reader skips rows without decoding them (a byte scan for text and JSON Lines, whole row
groups from the metadata for Parquet, an O(1) slice for a saved dataset) and yields records
for `fields._make_row`; going backwards means opening a new reader. pyarrow and datasets are
imported only when a Parquet file or a saved dataset is opened.

CSV counting and skipping use the csv module's C parser (`sum(map(bool, reader))`), not a
newline count: a byte scan that tracks quote parity miscounts rows such as `a 5" statue,1`,
where the csv module reads a stray quote in an unquoted field literally, and indices must
agree with what reading yields. It costs ~0.3 s per million short rows on one core.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .errors import MissingColumn, SourceError
from .fields import Record, _Bad
from .location import RemotePath

# Read size for the line scanner: large enough that bytes.count and the blank-line regex run
# at memory speed, small enough to be noise next to a rank's model.
BLOCK = 1 << 20
# Rows decoded per Arrow batch: prompts are ~100 bytes; image bytes can be megabytes each, so
# a batch carrying images is kept small.
BATCH_ROWS = 1024
BATCH_ROWS_WITH_IMAGES = 16
BOM = b"\xef\xbb\xbf"
# JSON Lines has no header: the keys of this many first rows stand for its columns.
SCHEMA_ROWS = 100
# A blank line that follows a newline; the lookahead stops at the search's endpos, so a chunk
# boundary never pairs lines of two chunks.
_BLANK_AFTER_NEWLINE = re.compile(rb"\n[ \t\r\f\v]*(?=\n)")
_BLANK_FIRST = re.compile(rb"[ \t\r\f\v]*\n")
T = TypeVar("T")


class _Reader(Protocol):
    """One file, read forward only; a new reader is opened to go backwards."""

    def skip(self, n: int) -> int:
        """Skip up to n rows without validating them; returns how many (fewer = end of file)."""
        ...

    def next(self) -> Record | None:
        """The next row's record, or None at the end of the file."""
        ...

    def close(self) -> None: ...


class _LineReader:
    """Text and JSON Lines over a byte buffer, so that skipping is bytes.count plus one regex.

    JSON Lines has no header: its columns are the keys of its first SCHEMA_ROWS objects, and a
    mapped column (`needed`) that none of them has is refused when the file is opened.

    Where rows begin is written down as the scan passes: `marks[row] = byte offset` (rows of this
    file) at the end of every block a skip crosses whole, one mark per BLOCK bytes. A reader opened
    `at=(row, offset)` of a mark starts there: the source's later seeks read at most a block
    before their row instead of the file from its start (a bucket's object by range).
    """

    def __init__(self, path: Path | RemotePath, kind: str, prompt_key: str, needed: list[str] | None = None,
                 at: tuple[int, int] = (0, 0), marks: dict[int, int] | None = None):
        self.path = path
        self.kind = kind
        self.prompt_key = prompt_key
        self.f = path.open("rb")  # closed by close(), the reader outlives a with-block (a Path or RemotePath)
        self.row, self.offset = at  # the row the reader returns next; the file offset of buf[0]
        self.marks = marks if marks is not None else {}
        if self.offset:
            self.f.seek(self.offset)
        self.buf = b""
        self.pos = 0
        self.eof = False
        if self._fill() and not self.offset:
            if self.buf.startswith(BOM):
                self.pos = len(BOM)
            if kind == "jsonl" and self.buf[self.pos:].lstrip()[:1] == b"[":
                self.f.close()
                raise SourceError(f"{path}: a JSON array, not JSON Lines (one object per line); convert it, e.g. "
                                  f"jq -c '.[]' {path.name} > {path.stem}.jsonl")
            if kind == "jsonl" and needed:
                found = self._first_keys()
                if found and (missing := [c for c in needed if c not in found]):
                    self.f.close()
                    raise MissingColumn(path, missing[0], found)

    def _first_keys(self) -> list[str]:
        """The keys of the first objects in the first block, in order of appearance (none when
        no line there is an object: those rows then fail one by one, with their reasons)."""
        keys: dict[str, None] = {}
        lines = (line for line in self.buf[self.pos:].split(b"\n") if line.strip())
        for line in islice(lines, SCHEMA_ROWS):
            try:
                obj = json.loads(line)  # a line cut at the block's end is not valid JSON: skipped
            except ValueError:
                continue
            if isinstance(obj, dict):
                keys.update(dict.fromkeys(map(str, obj)))
        return list(keys)

    def _fill(self) -> bool:
        if self.eof:
            return False
        data = self.f.read(BLOCK)
        if not data:
            self.eof = True
            return False
        self.offset += self.pos
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        return True

    def tell(self) -> int:
        """The file offset where the next row's line (or a blank line before it) begins."""
        return self.offset + self.pos

    def _line(self) -> bytes | None:
        while True:
            i = self.buf.find(b"\n", self.pos)
            if i >= 0:
                line, self.pos = self.buf[self.pos:i + 1], i + 1
                return line
            if not self._fill():
                if self.pos < len(self.buf):
                    line, self.pos = self.buf[self.pos:], len(self.buf)
                    return line
                return None

    def skip(self, n: int) -> int:
        done = 0
        while done < n:
            end = self.buf.rfind(b"\n", self.pos) + 1
            if end > self.pos:
                lines = self.buf.count(b"\n", self.pos, end)
                blank = len(_BLANK_AFTER_NEWLINE.findall(self.buf, self.pos, end))
                blank += _BLANK_FIRST.match(self.buf, self.pos) is not None
                if done + lines - blank <= n:
                    done += lines - blank
                    self.pos = end
                    self.marks[self.row + done] = self.tell()
                    continue
                while done < n:  # the target is in this block: walk its lines
                    line = self._line()
                    done += bool(line and line.strip())
                continue
            if not self._fill():
                line = self._line()
                done += bool(line and line.strip())
                break
        self.row += done
        return done

    def next(self) -> Record | None:
        while (line := self._line()) is not None:
            if not line.strip():
                continue
            self.row += 1
            if self.kind == "text":
                try:
                    return {self.prompt_key: line.decode().strip()}
                except UnicodeDecodeError as e:
                    return _Bad(f"line is not valid UTF-8 ({e})")
            try:
                obj = json.loads(line)
            except ValueError as e:
                return _Bad(f"line is not valid JSON ({e})")
            if not isinstance(obj, dict):
                return _Bad(f"line is a JSON {type(obj).__name__}, not an object")
            return obj
        return None

    def close(self) -> None:
        self.f.close()


class _CsvReader:
    """CSV with a header row; fields stay strings until _make_row converts them."""

    def __init__(self, path: Path | RemotePath, needed: list[str]):
        self.path = path
        self.f = path.open("r", encoding="utf-8-sig", newline="")  # closed by close()
        self.reader = csv.reader(self.f)
        # csv.reader yields [] for an empty line: filter(None, ...) drops those in C.
        self.records = filter(None, self.reader)
        header = self._guard(lambda: next(self.records, None))
        if header is None:
            self.f.close()
            raise SourceError(f"{path}: empty CSV, no header row; the first line must name the columns")
        self.header = header
        if missing := [c for c in needed if c not in header]:
            self.f.close()
            raise MissingColumn(path, missing[0], header)

    def _guard(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except csv.Error as e:
            raise SourceError(f"{self.path}: line {self.reader.line_num}: malformed CSV ({e})") from e
        except UnicodeDecodeError as e:
            raise SourceError(f"{self.path}: not UTF-8 text ({e}); re-encode the file as UTF-8") from e

    def skip(self, n: int) -> int:
        return self._guard(lambda: sum(map(bool, islice(self.records, n))))

    def next(self) -> Record | None:
        fields_ = self._guard(lambda: next(self.records, None))
        if fields_ is None:
            return None
        if len(fields_) != len(self.header):
            return _Bad(f"line {self.reader.line_num}: {len(fields_)} fields, the header has {len(self.header)} "
                        "(quote fields that contain commas)")
        return dict(zip(self.header, fields_, strict=True))

    def close(self) -> None:
        self.f.close()


class _BatchReader:
    """Shared by Parquet and saved datasets: rows come from Arrow batches, decoded lazily."""

    num_rows: int

    def __init__(self) -> None:
        self.pos = 0  # file-relative index of the next row
        self.buf: list[Record] = []
        self.buf_start = 0

    def skip(self, n: int) -> int:
        moved = max(0, min(n, self.num_rows - self.pos))
        self.pos += moved
        return moved

    def next(self) -> Record | None:
        if self.pos >= self.num_rows:
            return None
        if not self.buf_start <= self.pos < self.buf_start + len(self.buf):
            self.buf, self.buf_start = self._load(self.pos), self.pos
        self.pos += 1
        return self.buf[self.pos - 1 - self.buf_start]

    def _load(self, pos: int) -> list[Record]:
        raise NotImplementedError

    def close(self) -> None:
        self.buf = []


def _records(table: Any) -> list[Record]:
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


class _ParquetReader(_BatchReader):
    """Reads only the mapped columns, from the row group holding the cursor onward."""

    def __init__(self, path: Path | RemotePath, needed: list[str], batch_rows: int):
        super().__init__()
        import pyarrow.parquet as pq

        self.path = path
        self.needed = needed
        self.batch_rows = batch_rows
        # In object storage, pyarrow reads by range: the footer, then each column chunk it decodes.
        self._remote = path.open_ranged() if isinstance(path, RemotePath) else None
        try:
            self.file = pq.ParquetFile(self._remote if self._remote is not None else path)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not Parquet
            raise SourceError(f"{path}: not a readable Parquet file ({e})") from e
        names = self.file.schema_arrow.names
        if missing := [c for c in needed if c not in names]:
            raise MissingColumn(path, missing[0], names)
        meta = self.file.metadata
        self.num_rows = meta.num_rows
        self.group_starts = [0]
        for g in range(meta.num_row_groups):
            self.group_starts.append(self.group_starts[-1] + meta.row_group(g).num_rows)
        self.batches: Iterator[Any] | None = None
        self.batches_pos = 0  # file-relative index of the first row of the next batch

    def _group_of(self, pos: int) -> int:
        # Few row groups per file (tens to thousands): a linear scan is not worth bisect's import.
        g = 0
        while self.group_starts[g + 1] <= pos:
            g += 1
        return g

    def _load(self, pos: int) -> list[Record]:
        if self.batches is None or pos >= self.group_starts[self._group_of(self.batches_pos) + 1]:
            # The target is in a later row group: start there, never decoding the groups between.
            g = self._group_of(pos)
            self.batches = self.file.iter_batches(batch_size=self.batch_rows, columns=self.needed,
                                                  row_groups=list(range(g, len(self.group_starts) - 1)))
            self.batches_pos = self.group_starts[g]
        while True:
            batch = next(self.batches)
            first, self.batches_pos = self.batches_pos, self.batches_pos + batch.num_rows
            if self.batches_pos > pos:
                return _records(batch.slice(pos - first))

    def close(self) -> None:
        super().close()
        self.batches = None
        self.file.close()
        if self._remote is not None:
            self._remote.close()


def _load_hf(path: Path, needed: list[str]) -> Any:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # FileNotFoundError, json errors, ... from a damaged save
        raise SourceError(f"{path}: cannot open the saved dataset ({e})") from e
    if not isinstance(ds, datasets.Dataset):
        raise SourceError(f"{path}: a {type(ds).__name__}, not one Dataset; point the source at one split's folder")
    if missing := [c for c in needed if c not in ds.column_names]:
        raise MissingColumn(path, missing[0], ds.column_names)
    # Arrow format: slices stay zero-copy views of the memory-mapped files, and Image/Audio
    # features are not decoded (an Image cell is {"bytes", "path"}).
    return ds.select_columns(needed).with_format("arrow")


class _HFReader(_BatchReader):
    def __init__(self, dataset: Any, batch_rows: int):
        super().__init__()
        self.dataset = dataset
        self.batch_rows = batch_rows
        self.num_rows = len(dataset)

    def _load(self, pos: int) -> list[Record]:
        return _records(self.dataset[pos:pos + self.batch_rows])
