"""Streaming row readers for dataset-scale jobs: JSON Lines, CSV, Parquet, text, saved HF datasets.

A job of 10^5-10^7 items never fits one rank's memory as a list, and ranks do not take fixed
shards: they claim chunks from an ever-increasing shared counter (work/claims), so one rank asks
for ranges whose `begin` only grows. `RowSource` is built for that access pattern: it keeps a
cursor and skips forward without decoding the skipped rows (a byte scan for text and JSON
Lines, whole row groups from the metadata for Parquet, an O(1) slice for a saved dataset), and
reopens only when asked to go backwards.

Indices are positions in the whole source: a folder of files of one format is read as the
concatenation of its files sorted by name, so index 0 is the first row of the first file.
A source in object storage (a `RemotePath`) is read the same way, by ranged requests: Parquet's
footer and the row groups a rank decodes, line formats block by block as they are scanned.

Blank (whitespace-only) lines are not rows in text, JSON Lines and CSV alike, and a file's
header is not a row, so indices never depend on how a file happens to be laid out.

Errors come in two sizes. One bad row (invalid JSON, a seed that is not an integer, an empty
prompt) is one failed item: it comes out of `rows()` as a `Row` with `error` set, so the caller
records that item as failed and carries on. A problem with a whole file (an unknown format, or
a mapped column that the header or schema lacks: `MissingColumn`) raises `SourceError` when the
file is opened: no item of it could run. JSON Lines has no header, so its columns are the keys
of its first 100 objects.

One concept per module:

- `source`: `RowSource`, the stream of rows [start, end) and its cursor;
- `detection`: which format and which files a path names (`detect`, `FORMATS`);
- `readers`: one file read forward (JSON Lines and text, CSV, Parquet, saved datasets);
- `fields`: `Columns`, `Row`, and parsing and validating each row's values;
- `errors`: `SourceError`, `MissingColumn`;
- `location`: `RemotePath`, a source in object storage (spec.dataset.uri) read by range (opened by
  muralist_api.storage.open_location).

The names callers need are re-exported here.
"""

from .detection import FORMATS, detect
from .errors import MissingColumn, SourceError
from .fields import Columns, Row
from .location import RemotePath
from .source import RowSource

__all__ = ["FORMATS", "Columns", "MissingColumn", "RemotePath", "Row", "RowSource", "SourceError", "detect"]
