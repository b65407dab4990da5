"""Which format and which files a source path names: one file, or a folder of files of one format.

A folder is read as the concatenation of its files sorted by name; a saved `datasets` dataset
(a folder with the files `Dataset.save_to_disk` writes) is one source of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import SourceError
from .location import RemotePath, source_path

FORMATS = ("jsonl", "csv", "parquet", "text", "hf")
EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
              ".parquet": "parquet", ".txt": "text"}
# What `datasets.Dataset.save_to_disk` writes next to its Arrow files.
HF_MARKERS = ("dataset_info.json", "state.json")


def detect(path: str | os.PathLike[str] | RemotePath, fmt: str = "auto") -> tuple[str, list[Path]]:
    """The format and the files (sorted by name) of a file or a folder of files.

    Names starting with "." or "_" are skipped in a folder: temp files, `_SUCCESS` markers and
    Arrow/Spark `_metadata` files are not data. With an explicit format every other file is
    read as that format (part files often have no extension); with "auto" every file needs a
    known extension and all must agree.
    """
    p = source_path(path)  # a Path, or a RemotePath (object storage) that answers the same questions
    if fmt != "auto" and fmt not in FORMATS:
        raise SourceError(f"{p}: unknown format {fmt!r}; use one of auto, {', '.join(FORMATS)}")
    if not p.exists():
        raise SourceError(f"{p}: no such file or folder")
    if p.is_dir():
        if (p / "dataset_dict.json").exists():
            splits = sorted(c.name for c in p.iterdir() if c.is_dir())
            raise SourceError(f"{p}: a saved DatasetDict with splits {splits}; point the source at one split's "
                              f"folder, e.g. {p / (splits[0] if splits else 'train')}")
        if fmt in ("auto", "hf") and any((p / m).exists() for m in HF_MARKERS):
            if isinstance(p, RemotePath):
                raise SourceError(f"{p}: a saved datasets dataset is read from a volume only; in object storage, "
                                  "write the rows as Parquet (Dataset.to_parquet) and point the uri at them")
            return "hf", [p]
        if fmt == "hf":
            raise SourceError(f"{p}: not a saved datasets dataset (no {' or '.join(HF_MARKERS)}); "
                              "write it with Dataset.save_to_disk")
        entries = sorted(c for c in p.iterdir() if not c.name.startswith((".", "_")))
        if subdirs := [c.name for c in entries if c.is_dir()]:
            raise SourceError(f"{p}: contains folders {subdirs[:5]}; a source is one file or one folder of "
                              "files of one format: point it at a folder without sub-folders")
        if not entries:
            raise SourceError(f"{p}: the folder has no data files")
        if fmt != "auto":
            return fmt, entries
        kinds = {c.name: EXTENSIONS.get(c.suffix.lower()) for c in entries}
        if unknown := [n for n, k in kinds.items() if k is None]:
            raise SourceError(f"{p}: cannot tell the format of {unknown[:5]} (known extensions: "
                              f"{', '.join(EXTENSIONS)}); rename them or set the format explicitly")
        if len(found := {k for k in kinds.values() if k is not None}) > 1:
            raise SourceError(f"{p}: mixed formats {sorted(found)} in one folder; put each format in its own "
                              "folder, one source per folder")
        return found.pop(), entries
    if fmt == "hf":
        raise SourceError(f"{p}: a saved datasets dataset is a folder, not a file")
    if fmt != "auto":
        return fmt, [p]
    kind = EXTENSIONS.get(p.suffix.lower())
    if kind is None:
        raise SourceError(f"{p}: cannot tell the format from the extension {p.suffix!r} (known: "
                          f"{', '.join(EXTENSIONS)}); rename it or set the format explicitly")
    return kind, [p]
