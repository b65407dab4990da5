"""`RowSource`: rows [start, end) of a file or folder, streamed by increasing index.

Ranks claim chunks whose `begin` only grows, so the source keeps a cursor (which file, which
row) and skips forward through its readers without decoding the skipped rows; it reopens only
when asked to go backwards. Per-file row counts are cached once known, so files that end
before a target are not opened again.

In text and JSON Lines, where a row begins is known only by scanning to it: the scan that counts
the rows (at construction) writes down where every block's rows begin (readers._LineReader), and
a seek starts at the nearest of those marks before its row. So a rank reads such a file once to
count it, then at most a block before each chunk it claims, instead of the file from its start
for every claim: what keeps ranged reads from a bucket ranged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import readers
from .detection import detect
from .errors import SourceError
from .fields import Columns, Row, _make_row
from .location import RemotePath, source_path
from .readers import (
    BATCH_ROWS,
    BATCH_ROWS_WITH_IMAGES,
    _CsvReader,
    _HFReader,
    _LineReader,
    _load_hf,
    _ParquetReader,
    _Reader,
)


class RowSource:
    """Rows [start, end) of a file or folder, read as a stream by increasing index.

    Not thread-safe, and one `rows()` iteration at a time: a new call takes over the cursor,
    and an older iterator then raises RuntimeError instead of yielding rows of the wrong range.
    """

    def __init__(self, path: str | os.PathLike[str] | RemotePath, fmt: str = "auto",
                 columns: Columns = Columns(),  # noqa: B008 - a frozen dataclass, safe to share
                 start: int = 0, end: int | None = None):
        if start < 0 or (end is not None and end < start):
            raise SourceError(f"{path}: bad row range [{start}, {end})")
        self.path = source_path(path)
        self.format, self.files = detect(path, fmt)
        self.columns = columns
        self.start = start
        self.end = end
        mapped = columns.mapped()
        if "prompt" not in mapped and "image" not in mapped:
            raise SourceError(f"{self.path}: map a prompt column or an image column; neither is set")
        if self.format == "text" and set(mapped) != {"prompt"}:
            raise SourceError(f"{self.path}: a text source has one prompt per line and no columns; "
                              f"cannot map {sorted(set(mapped) - {'prompt'})}: use JSON Lines, CSV or Parquet")
        self._counts: list[int | None] = [None] * len(self.files)
        self._marks: list[dict[int, int]] = [{} for _ in self.files]  # line formats: row in file -> offset
        self._cursor: _Cursor | None = None
        self._epoch = 0
        self._hf_dataset: Any = None
        self._checked: set[int] = set()  # files whose columns were checked
        # Fail at construction, not at the first claim, when the first file lacks a column.
        self._open(0).close()

    def __enter__(self) -> RowSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.reader.close()
            self._cursor = None

    def count(self) -> int:
        """Rows in [start, end). Counts are cached per file; files past `end` are not opened."""
        total = 0
        for i in range(len(self.files)):
            if self.end is not None and total >= self.end:
                break
            total += self._file_count(i)
        hi = total if self.end is None else min(total, self.end)
        return max(0, hi - self.start)

    def rows(self, begin: int, end: int) -> Iterator[Row]:
        """Rows with begin <= index < end, clipped to [start, end) of the source."""
        self._epoch += 1
        return self._rows(max(begin, self.start), end if self.end is None else min(end, self.end), self._epoch)

    def _rows(self, lo: int, hi: int, epoch: int) -> Iterator[Row]:
        if lo >= hi:
            return
        cursor = self._seek(lo)
        while True:
            if epoch != self._epoch:
                raise RuntimeError("RowSource.rows() was called again; this iterator's cursor is gone")
            if cursor is None or cursor.pos >= hi:
                return
            record = cursor.reader.next()
            if record is None:
                cursor = self._next_file(cursor)
                continue
            row = _make_row(cursor.pos, record, self.columns)
            cursor.pos += 1
            yield row

    def _seek(self, target: int) -> _Cursor | None:
        cursor = self._cursor
        if cursor is not None and cursor.pos > target:
            cursor.reader.close()
            cursor = self._cursor = None
        mark = self._mark_before(target)
        if mark is not None and self._worth_a_jump(cursor, mark):
            if cursor is not None:
                cursor.reader.close()
            file, base, row, offset = mark
            cursor = self._cursor = _Cursor(file, base, self._open(file, at=(row, offset)), base + row)
        if cursor is None:
            cursor = self._first_cursor(0, 0, target)
        while cursor is not None and cursor.pos < target:
            known = self._counts[cursor.file]
            if known is not None and target >= cursor.base + known:
                cursor = self._next_file(cursor, target)
                continue
            cursor.pos += cursor.reader.skip(target - cursor.pos)
            if cursor.pos < target:
                cursor = self._next_file(cursor, target)
        return cursor

    @staticmethod
    def _worth_a_jump(cursor: _Cursor | None, mark: tuple[int, int, int, int]) -> bool:
        """Reopen at the mark unless the cursor is less than a block before it in the same file
        (a reopen is a new request in a bucket; scanning that far costs less)."""
        if cursor is None or mark[0] != cursor.file:
            return cursor is None or mark[0] > cursor.file
        return isinstance(cursor.reader, _LineReader) and mark[3] > cursor.reader.tell() + readers.BLOCK

    def _mark_before(self, target: int) -> tuple[int, int, int, int] | None:
        """The last known line start at or before the global row `target` in the file holding it:
        (file, its first row, row in the file, byte offset); None when none is known. The files
        before are counted (a file of unknown count may hold the target: it ends the search)."""
        base = 0
        for file, count in enumerate(self._counts):
            if count is None or target < base + count:
                rows = [r for r in self._marks[file] if base + r <= target]
                if not rows:
                    return None
                row = max(rows)
                return file, base, row, self._marks[file][row]
            base += count
        return None

    def _next_file(self, cursor: _Cursor, target: int = 0) -> _Cursor | None:
        """Close the cursor's file (its row count is now known) and open the next one needed."""
        cursor.reader.close()
        count = self._counts[cursor.file]
        if count is None:
            count = self._counts[cursor.file] = cursor.pos - cursor.base
        return self._first_cursor(cursor.file + 1, cursor.base + count, target)

    def _first_cursor(self, file: int, base: int, target: int) -> _Cursor | None:
        # Files whose counts are known and end before the target are not opened at all.
        while file < len(self.files) and (n := self._counts[file]) is not None and base + n <= target:
            base += n
            file += 1
        self._cursor = None if file >= len(self.files) else _Cursor(file, base, self._open(file), base)
        return self._cursor

    def _file_count(self, i: int) -> int:
        if self._counts[i] is None:
            reader = self._open(i)
            try:
                self._counts[i] = reader.skip(2**62)
            finally:
                reader.close()
        return self._counts[i]  # type: ignore[return-value]

    def _open(self, i: int, at: tuple[int, int] = (0, 0)) -> _Reader:
        """File i's reader; `at` (line formats): start at a mark, (row in the file, byte offset)."""
        path = self.files[i]
        needed = list(dict.fromkeys(self.columns.mapped().values()))
        batch = BATCH_ROWS_WITH_IMAGES if self.columns.image or self.columns.mask else BATCH_ROWS
        if self.format in ("text", "jsonl"):
            # JSON Lines' columns are read from its first rows: once per file is enough.
            reader = _LineReader(path, self.format, self.columns.prompt or "prompt",
                                 None if i in self._checked else needed, at, self._marks[i])
            self._checked.add(i)
            return reader
        if self.format == "csv":
            return _CsvReader(path, needed)
        if self.format == "parquet":
            return _ParquetReader(path, needed, batch)
        if self._hf_dataset is None:
            self._hf_dataset = _load_hf(path, needed)
        return _HFReader(self._hf_dataset, batch)


@dataclass
class _Cursor:
    file: int  # index into RowSource.files
    base: int  # global index of that file's first row
    reader: _Reader
    pos: int  # global index of the row the reader returns next
