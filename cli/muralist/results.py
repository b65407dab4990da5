"""What a finished job made, read from its output folder: the index as a table, an item's image.

The folder is the one `docs/concepts/items.md` describes: `index.parquet` (one row per item, in
item order: index, id, key, prompt, seed, shard, status, seconds, error), written when the job
merges at its end, and each item's output under `images/<key>.<format>` (layout files) or as the
member `<key>.<format>` of `shards/shard-<shard>.tar` (layout webdataset). `job.json` records the
format. Today outputs are volumes, so the folder is read where the volume is mounted on this
machine; reading from object storage comes with outputs there.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from muralist_api.job import DiffusionJob

INDEX_FILE = "index.parquet"
JOB_FILE = "job.json"
SHARD_FILE = "shards/shard-{shard:06d}.tar"
# Formats Pillow opens (an animated webp or gif as a multi-frame image); mp4 is a video file.
IMAGE_FORMATS = frozenset({"png", "jpeg", "webp", "gif"})

Folder = str | os.PathLike[str]


def output_folder(job: DiffusionJob, root: Folder | None = None) -> Path:
    """The job's output folder on this machine: `root` is where its output volume is mounted
    here; without it, a hostPath volume is read at its path (a single-node or test cluster)."""
    inside = (job.status.output_path if job.status and job.status.output_path else job.output_path).strip("/")
    if root is not None:
        return Path(root) / inside
    host_path = (job.spec.output.volume or {}).get("hostPath") or {}
    if isinstance(host_path, dict) and host_path.get("path"):
        return Path(host_path["path"]) / inside
    raise ValueError(f"DiffusionJob {job.metadata.name} writes to a volume this machine cannot see: mount it "
                     f"and pass root=<where it is mounted> (its items are in {inside}/ inside it)")


def read_index(folder: Folder, as_pandas: bool = False) -> Any:
    """The folder's index.parquet as a pyarrow Table, or a pandas DataFrame when `as_pandas`."""
    import pyarrow.parquet as pq

    table = pq.read_table(_index_path(Path(folder)))
    if not as_pandas:
        return table
    if importlib.util.find_spec("pandas") is None:  # to_pandas needs it: say so plainly
        raise ImportError("as_pandas=True needs pandas: pip install pandas")
    return table.to_pandas()


def output_format(folder: Folder) -> str:
    """spec.output.format as the folder's job.json recorded it."""
    recorded = json.loads((Path(folder) / JOB_FILE).read_text())
    return str(recorded["spec"]["spec"]["output"]["format"])


def item_bytes(folder: Folder, key: str) -> bytes:
    """The encoded output of item `key` (an image or a video file), from either layout."""
    folder = Path(folder)
    row = _index_row(folder, key)
    if row["status"] == "failed":
        raise LookupError(f"item {key} failed: {row.get('error') or 'no error recorded'}")
    member = f"{key}.{output_format(folder)}"
    if row.get("shard") is None:
        return (folder / "images" / member).read_bytes()
    with tarfile.open(folder / SHARD_FILE.format(shard=row["shard"]), "r:") as tar:
        data = tar.extractfile(member)
        if data is None:
            raise LookupError(f"{member} is not a file in shard {row['shard']}")
        return data.read()


def open_image(folder: Folder, key: str) -> Any:
    """Item `key`'s image as a PIL Image (loaded, so no file stays open)."""
    fmt = output_format(folder)
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"the job's outputs are {fmt} videos: read the file with item_bytes()")
    from PIL import Image

    image = Image.open(io.BytesIO(item_bytes(folder, key)))
    image.load()
    return image


def _index_row(folder: Path, key: str) -> dict[str, Any]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = _index_path(folder)
    rows = pq.read_table(path, columns=["key", "shard", "status", "error"], filters=pc.field("key") == key)
    if not rows.num_rows:
        raise KeyError(f"no item {key!r} in {path} (keys are <row>-<image>, e.g. 00000-000)")
    return dict(rows.to_pylist()[0])


def _index_path(folder: Path) -> Path:
    path = folder / INDEX_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no index yet; the job writes it when every item is done "
                                "(a job still running, or one that failed before its end, has none)")
    return path
