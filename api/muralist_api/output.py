"""spec.output: where a job's images are written (a volume, or object storage), in which format and layout."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from muralist_api.base import KubeObject, relative_path
from muralist_api.cel import CelRule, python_rule
from muralist_api.storage import StoredAt, location_rules


@python_rule()
def output_path(value: str) -> str:
    """spec.output.path: a directory inside the volume (relative, no '..') that is not empty."""
    if not value.strip("/") and not value.startswith("/"):
        raise ValueError("must not be empty; leave it out to use metadata.name")
    return relative_path(value)


class Output(StoredAt):
    section = "spec.output"
    cel_rules = location_rules(section, volume_required=False)

    volume: KubeObject | None = Field(
        None,
        description="A Kubernetes VolumeSource for the results (e.g. a PVC); default an emptyDir (or set uri: "
        "the results are then written as whole objects under <uri>/<path>).",
    )
    path: Annotated[
        str | None,
        CelRule("!self.startsWith('/')", "spec.output.path must be relative to the volume", mirrors=output_path),
        CelRule(
            "!self.matches('(^|/)[.][.](/|$)')",
            "spec.output.path must not contain '..': it must stay inside the volume",
            mirrors=output_path,
        ),
        CelRule("self.matches('[^/]')", "spec.output.path must not be empty", mirrors=output_path),
    ] = Field(
        None,
        max_length=1024,
        description="Directory inside the volume (or under the uri), relative, without '..'; default "
        "metadata.name.",
    )
    format: Literal["png", "jpeg", "webp", "mp4", "gif"] = Field(
        "png",
        description="png | jpeg | webp for images; mp4 (H.264, yuv420p), webp (animated, lossless) or gif for "
        "videos.",
    )

    layout: Literal["files", "webdataset"] = Field(
        "files",
        description="files: images/<key>.<format> with a JSON file each; webdataset: tar shards of shardSize "
        "rows (image and JSON members per item) with a Parquet index of every item.",
    )
    shard_size: int = Field(
        1000, ge=1, le=100_000,
        description="Rows per WebDataset shard (each row's imagesPerPrompt images go in the same shard).",
    )
    gallery_page_size: int = Field(200, ge=1, le=10_000, description="Items per gallery page.")
    shared: bool = Field(
        False,
        description="Render into a folder that another DiffusionJob (another name or namespace) wrote: its items "
        "made for the same request are kept, the others rendered again, and the folder is this job's from then "
        "on. Without it such a folder is refused (exit 78). Jobs take turns: two must not run into one folder at "
        "once. The same job deleted and applied again needs no sharing: it resumes.",
    )

    @field_validator("path")
    @classmethod
    def _relative_inside_volume(cls, value: str | None) -> str | None:
        return value if value is None else output_path(value)
