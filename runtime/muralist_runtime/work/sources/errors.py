"""The errors for a whole source or file that cannot be read (one bad row is a failed `Row` instead)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


class SourceError(ValueError):
    """A whole source or file cannot be read as asked; the message says which and what to do."""


class MissingColumn(SourceError):
    """A mapped column that a file's header, schema or first rows lack (`found`: what they have)."""

    def __init__(self, path: Any, column: str, found: Sequence[str]):
        self.path = Path(path) if isinstance(path, str) else path  # a Path, or a source's RemotePath
        self.column = column
        self.found = list(found)
        super().__init__(f"{path}: {self.detail()}")

    def detail(self, file: str = "") -> str:
        """`no column 'text'; columns: uid, caption, seed` (`file`: which file of a folder)."""
        where = f" in {file}" if file else ""
        return f"no column {self.column!r}{where}; columns: {', '.join(self.found) or '(none)'}"
