"""What a finished job made, read from its output folder: the index as a table, an item's image.

The folder is the one `docs/concepts/items.md` describes, its names those of the output-folder
contract (muralist_api/contract/output_folder.py): the index (one row per item, in item order: index,
id, key, prompt, seed, shard, status, seconds, error), written when the job merges at its end, and each
item's output under `images/<key>.<format>` (layout files) or as the member `<key>.<format>` of its
chunk's shard (layout webdataset). The job file records the format. A folder is a local path (where the
job's output volume is mounted on this machine) or a URI (spec.output.uri: s3://bucket/prefix/<path>),
opened by `muralist_api.storage.open_location` with the job's endpoint and this machine's credentials
(AWS_* variables, a profile, an instance role).
"""

from __future__ import annotations

import importlib.util
import io
import os
import tarfile
from pathlib import Path
from typing import Any

from muralist_api.contract.output_folder import INDEX_FILE, JOB_FILE, JobRecord, item_file, member_name, shard_file
from muralist_api.job import DiffusionJob
from muralist_api.storage import is_uri, join_uri, open_location

# Formats Pillow opens (an animated webp or gif as a multi-frame image); mp4 is a video file.
IMAGE_FORMATS = frozenset({"png", "jpeg", "webp", "gif"})

Folder = str | os.PathLike[str]


def _files(folder: Folder, options: dict[str, Any] | None) -> tuple[Any, str]:
    """(fsspec file system, the folder's path on it): a URI's protocol (`options`: fsspec's), or the local disk."""
    return open_location(folder, options=options)


def output_folder(job: DiffusionJob, root: Folder | None = None) -> Path | str:
    """The job's output folder: its URI when it writes to object storage (spec.output.uri), else the
    folder on this machine: `root` is where its output volume is mounted here (or another URI);
    without it, a hostPath volume is read at its path (a single-node or test cluster)."""
    inside = (job.status.output_path if job.status and job.status.output_path else job.output_path).strip("/")
    if root is not None:
        return join_uri(str(root), inside) if is_uri(root) else Path(root) / inside
    if job.spec.output.uri:
        return join_uri(job.spec.output.uri, inside)
    host_path = (job.spec.output.volume or {}).get("hostPath") or {}
    if isinstance(host_path, dict) and host_path.get("path"):
        return Path(host_path["path"]) / inside
    raise ValueError(f"DiffusionJob {job.metadata.name} writes to a volume this machine cannot see: mount it "
                     f"and pass root=<where it is mounted> (its items are in {inside}/ inside it)")


def read_index(folder: Folder, as_pandas: bool = False, storage_options: dict[str, Any] | None = None) -> Any:
    """The folder's index as a pyarrow Table, or a pandas DataFrame when `as_pandas`
    (`storage_options`: fsspec's, for a URI, e.g. its endpoint)."""
    import pyarrow.parquet as pq

    fs, root = _files(folder, storage_options)
    table = pq.read_table(_index_path(fs, root), filesystem=fs)
    if not as_pandas:
        return table
    if importlib.util.find_spec("pandas") is None:  # to_pandas needs it: say so plainly
        raise ImportError("as_pandas=True needs pandas: pip install pandas")
    return table.to_pandas()


def output_format(folder: Folder, storage_options: dict[str, Any] | None = None) -> str:
    """spec.output.format as the folder's job file recorded it."""
    fs, root = _files(folder, storage_options)
    return JobRecord.model_validate_json(fs.cat_file(f"{root}/{JOB_FILE}")).output.format


def item_bytes(folder: Folder, key: str, storage_options: dict[str, Any] | None = None) -> bytes:
    """The encoded output of item `key` (an image or a video file), from either layout."""
    fs, root = _files(folder, storage_options)
    row = _index_row(fs, root, key)
    if row["status"] == "failed":
        raise LookupError(f"item {key} failed: {row.get('error') or 'no error recorded'}")
    fmt = output_format(folder, storage_options)
    if row.get("shard") is None:
        data: bytes = fs.cat_file(f"{root}/{item_file(key, fmt)}")
        return data
    member = member_name(key, fmt)
    with fs.open(f"{root}/{shard_file(row['shard'])}", "rb") as f, \
            tarfile.open(fileobj=f, mode="r:") as tar:
        found = tar.extractfile(member)
        if found is None:
            raise LookupError(f"{member} is not a file in shard {row['shard']}")
        return found.read()


def open_image(folder: Folder, key: str, storage_options: dict[str, Any] | None = None) -> Any:
    """Item `key`'s image as a PIL Image (loaded, so no file stays open)."""
    fmt = output_format(folder, storage_options)
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"the job's outputs are {fmt} videos: read the file with item_bytes()")
    from PIL import Image

    image = Image.open(io.BytesIO(item_bytes(folder, key, storage_options)))
    image.load()
    return image


def _index_row(fs: Any, root: str, key: str) -> dict[str, Any]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = _index_path(fs, root)
    rows = pq.read_table(path, columns=["key", "shard", "status", "error"], filters=pc.field("key") == key,
                         filesystem=fs)
    if not rows.num_rows:
        raise KeyError(f"no item {key!r} in {path} (keys are <row>-<image>, e.g. 00000-000)")
    return dict(rows.to_pylist()[0])


def _index_path(fs: Any, root: str) -> str:
    path = f"{root}/{INDEX_FILE}"
    if not fs.isfile(path):
        raise FileNotFoundError(f"{path}: no index yet; the job writes it when every item is done "
                                "(a job still running, or one that failed before its end, has none)")
    return path
