"""The rows of a job: inline prompts and promptsFrom lines, or spec.dataset read as a stream.

Every rank opens the same rows and reads only the ranges it claims (work/chunks.py): a data set of
millions of rows is never held in memory, and an inline prompt list (bounded by admission to
what fits in the spec ConfigMap) is served from memory the same way. A row gives
generation.imagesPerPrompt items (muralist_api/items.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from muralist_api.contract import PermanentFailure
from muralist_api.data import Dataset
from muralist_api.items import Item, row_items
from muralist_api.job import Generation
from muralist_api.runtime_spec import RuntimeSpec

from .sources import Columns, MissingColumn, RemotePath, Row, RowSource, SourceError


class Rows(Protocol):
    start: int

    def count(self) -> int: ...

    def rows(self, begin: int, end: int) -> Iterator[Row]: ...

    def close(self) -> None: ...


class InlineRows:
    """Prompts that travel with the spec (inline and promptsFrom), as rows 0, 1, ..."""

    start = 0

    def __init__(self, rows: list[Row]):
        self._rows = rows

    def count(self) -> int:
        return len(self._rows)

    def rows(self, begin: int, end: int) -> Iterator[Row]:
        return iter(self._rows[max(0, begin):max(0, end)])

    def close(self) -> None:
        return None


def inline_rows(runtime: RuntimeSpec) -> InlineRows:
    """Inline prompts first, then the prompts file's non-blank lines (promptsFrom)."""
    out = [Row(index=i, id=p.id, prompt=p.text, negative_prompt=p.negative_prompt, seed=p.seed, image=p.image,
               mask=p.mask, strength=p.strength) for i, p in enumerate(runtime.spec.prompt_objects)]
    if runtime.spec.prompts_from is not None:
        if not runtime.prompts_file:
            raise PermanentFailure("spec.promptsFrom", "set, but no prompts file was mounted")
        try:
            lines = Path(runtime.prompts_file).read_text().splitlines()
        except OSError as e:
            raise PermanentFailure("spec.promptsFrom", f"cannot read {runtime.prompts_file}: {e.strerror}") from None
        out += [Row(index=len(out) + i, id=None, prompt=text)
                for i, text in enumerate(line.strip() for line in lines if line.strip())]
    if not out:
        raise PermanentFailure("spec.prompts", "no prompts to render")
    return InlineRows(out)


class DatasetRows:
    """spec.dataset through sources.RowSource: counted once, read forward by ranges."""

    def __init__(self, source: RowSource, dataset: Dataset):
        self._source = source
        self._dataset = dataset
        self.start = dataset.start

    def count(self) -> int:
        return self._source.count()

    def rows(self, begin: int, end: int) -> Iterator[Row]:
        try:
            yield from self._source.rows(begin, end)
        except SourceError as e:  # a later file of a folder that lacks a column: no retry helps
            raise source_failure(self._dataset, self._source.path, e) from None

    def close(self) -> None:
        self._source.close()


def dataset_rows(runtime: RuntimeSpec) -> DatasetRows:
    dataset = runtime.spec.dataset
    assert dataset is not None
    path: Path | RemotePath
    if runtime.dataset_uri:
        path = RemotePath.from_uri(runtime.dataset_uri, dataset.endpoint)
    elif runtime.dataset_dir:
        path = Path(runtime.dataset_dir) / dataset.path
    else:
        raise PermanentFailure("spec.dataset.volume", "set, but the data set volume was not mounted")
    c = dataset.columns
    columns = Columns(prompt=c.prompt, negative_prompt=c.negative_prompt, seed=c.seed, image=c.image, mask=c.mask,
                      strength=c.strength, id=c.id, height=c.height, width=c.width, num_frames=c.num_frames)
    try:
        # The first file's header, schema or first rows against every mapped column, then the
        # count: before any item renders and before any weight loads.
        source = RowSource(path, dataset.format, columns, dataset.start, dataset.end)
        source.count()
    except SourceError as e:
        raise source_failure(dataset, path, e) from None
    except OSError as e:
        raise PermanentFailure("spec.dataset.path", f"cannot read {path}: {e.strerror or e}") from None
    return DatasetRows(source, dataset)


def source_failure(dataset: Dataset, path: Path | RemotePath, e: SourceError) -> PermanentFailure:
    """A source (at `path`) that cannot be read as mapped: a missing column names the mapping
    to change (`spec.dataset.columns.prompt: no column 'text'; columns: uid, caption, seed`)."""
    if not isinstance(e, MissingColumn):
        return PermanentFailure("spec.dataset", str(e))
    fields = type(dataset.columns).model_fields
    name = next(n for n in fields if getattr(dataset.columns, n) == e.column)
    return PermanentFailure(f"spec.dataset.columns.{fields[name].alias or name}",
                            e.detail(e.path.name if e.path != path else ""))


def open_rows(runtime: RuntimeSpec) -> Rows:
    return dataset_rows(runtime) if runtime.spec.dataset is not None else inline_rows(runtime)


def peek(runtime: RuntimeSpec) -> list[Row]:
    """The first row, read by a source of its own: the job's source then starts its forward
    reading at the first chunk instead of going back (a reopen, a re-scan of a big file)."""
    source = open_rows(runtime)
    try:
        return list(source.rows(source.start, source.start + 1))
    finally:
        source.close()


def items_of(rows: Iterable[Row], generation: Generation) -> list[Item]:
    out: list[Item] = []
    for row in rows:
        out += row_items(row.index, row.prompt, generation, negative_prompt=row.negative_prompt, seed=row.seed,
                         id=row.id, image=row.image, mask=row.mask, strength=row.strength, height=row.height,
                         width=row.width, num_frames=row.num_frames, error=row.error)
    return out
