"""What to render: prompts inline, from a ConfigMap, or a data set on a volume or in a bucket; input images."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from muralist_api.base import ApiModel, KubeObject, relative_path
from muralist_api.cel import CelRule
from muralist_api.storage import StoredAt, location_rules


class ConfigMapKeyRef(ApiModel):
    name: str = Field(min_length=1, description="Name of the ConfigMap in the job's namespace.")
    key: str = Field(min_length=1, description="Key inside the ConfigMap; one prompt per line.")


class PromptSpec(ApiModel):
    text: str = Field(min_length=1, description="The prompt.")
    negative_prompt: str | None = Field(None, description="Negative prompt, for pipelines that take one.")
    seed: int | None = Field(None, ge=0, description="This prompt's seed; image i of the prompt uses seed + i.")
    id: str | None = Field(None, max_length=256, description="An id of your own for this prompt, kept in the metadata.")
    image: str | None = Field(
        None, max_length=1024,
        description="An input image (image-to-image, inpainting, edits, image-to-video): a path relative to "
        "spec.inputs (its volume or uri).",
    )
    mask: str | None = Field(
        None, max_length=1024,
        description="An inpainting mask, relative to spec.inputs (its volume or uri; white = repaint).",
    )
    strength: float | None = Field(
        None, gt=0, le=1, description="How far from the input image to go (0-1]; default the pipeline's."
    )

    @field_validator("image", "mask")
    @classmethod
    def _inside_inputs(cls, value: str | None) -> str | None:
        return None if value is None else relative_path(value)


class PromptsFrom(ApiModel):
    config_map_key_ref: ConfigMapKeyRef = Field(
        description="A ConfigMap key with one prompt per line (blank lines ignored)."
    )


class DatasetColumns(ApiModel):
    """Which column of the data set holds what (plain text files have only prompts)."""

    prompt: str = Field("prompt", min_length=1, description="Column with the prompt.")
    negative_prompt: str | None = Field(None, description="Column with the negative prompt.")
    seed: str | None = Field(None, description="Column with each row's seed (an integer).")
    image: str | None = Field(None, description="Column with the input image: a path relative to spec.inputs.")
    mask: str | None = Field(None, description="Column with the inpainting mask path.")
    strength: str | None = Field(None, description="Column with each row's strength.")
    id: str | None = Field(None, description="Column with each row's id, kept in the metadata and the index.")
    height: str | None = Field(
        None, description="Column with each row's height in pixels (a multiple of 8), instead of generation.height; "
        "a job of several sizes renders them grouped by size (one compiled graph per size with generation.compile).")
    width: str | None = Field(
        None, description="Column with each row's width in pixels (a multiple of 8), instead of generation.width.")
    num_frames: str | None = Field(
        None, description="Column with each row's frame count (video pipelines), instead of generation.numFrames.")


class Dataset(StoredAt):
    """Rows read as a stream by every rank: no pod ever holds the whole data set."""

    section = "spec.dataset"
    cel_rules: ClassVar[tuple[CelRule, ...]] = location_rules(section, volume_required=True)

    volume: KubeObject | None = Field(
        None, description="A Kubernetes VolumeSource holding the data set, mounted read-only (e.g. a PVC); or "
        "set uri."
    )
    path: str = Field(
        ".", min_length=1, max_length=1024,
        description="A file or a folder of files inside the volume (or under the uri), relative: JSON Lines, CSV, "
        "Parquet, text (one prompt per line), or a Hugging Face datasets dataset saved with save_to_disk (on a "
        "volume only). Default '.': the volume's root, or the uri itself.",
    )
    format: Literal["auto", "jsonl", "csv", "parquet", "text", "hf"] = Field(
        "auto", description="auto picks by extension (a folder with dataset_info.json is a saved dataset)."
    )
    columns: DatasetColumns = Field(default_factory=DatasetColumns, description="Column mapping.")
    start: int = Field(0, ge=0, description="First row to render (0-based).")
    end: int | None = Field(None, ge=1, description="Row to stop before; default the end of the data set.")

    @field_validator("path")
    @classmethod
    def _inside_volume(cls, value: str) -> str:
        return relative_path(value)


class Inputs(StoredAt):
    section = "spec.inputs"
    cel_rules: ClassVar[tuple[CelRule, ...]] = location_rules(section, volume_required=True)

    volume: KubeObject | None = Field(
        None, description="A Kubernetes VolumeSource with the input images that prompts and data-set rows name, "
        "mounted read-only; or set uri (each image is then read from under it, one object per input)."
    )
