"""spec.model: the diffusion model a job loads, where its weights come from and how they are read."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from muralist_api.base import ApiModel, KubeObject
from muralist_api.options import Adapter
from muralist_api.storage import URI_PATTERN, StoredAt


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, description="Name of the Secret in the job's namespace.")
    key: str = Field(min_length=1, description="Key inside the Secret.")


class ModelLoading(ApiModel):
    stage: bool = Field(
        False,
        description="Copy the model directory (a local path, or the hub snapshot once "
        "downloaded) to node-local disk (MURALIST_STAGE_DIR, an emptyDir) before loading, once "
        "per node; later restarts on that node skip the copy. Helps when the cache is a slow "
        "network volume read by several processes.",
    )
    no_mmap: bool = Field(
        False,
        description="Read safetensors files whole instead of memory-mapping them (diffusers "
        "disable_mmap); faster on network filesystems where mmap page faults are slow.",
    )


class CompileCache(StoredAt):
    """generation.compile's compile cache in object storage instead of on the model cache's volume."""

    section: ClassVar[str] = "spec.model.compileCache"

    uri: str = Field(  # required here, where the other sections may take a volume instead
        max_length=2048, pattern=URI_PATTERN,
        description="Where generation.compile keeps what it compiled (s3://bucket/prefix, gs://, az://, or any "
        "fsspec protocol): one object per model, size and setting, written once by the first rank that "
        "compiled it and loaded by every later pod and job that names the same prefix.",
    )


class ModelSpec(ApiModel):
    name: str = Field(
        min_length=1,
        max_length=1024,
        description=(
            "Hugging Face hub repo id (org/name), an absolute path inside the pod, or a "
            "built-in tiny pipeline without download, for quickstarts and tests: random weights "
            "('muralist/tiny-flux') or trained to draw coloured shapes ('muralist/tiny-shapes-flux')."
        ),
    )
    revision: str | None = Field(None, max_length=256, description="Hub revision (branch, tag or commit).")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "bfloat16", description="Weights and compute dtype: float32, float16 or bfloat16."
    )
    pipeline: str | None = Field(
        None,
        description="diffusers pipeline class (e.g. FluxPipeline); default: DiffusionPipeline "
        "auto-detects it from model_index.json.",
    )
    token_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding a hub token; reaches the pod only as HF_TOKEN."
    )
    cache: KubeObject | None = Field(
        None,
        description="A Kubernetes VolumeSource mounted as the Hugging Face cache (HF_HOME), "
        "e.g. {persistentVolumeClaim: {claimName: hf-cache}}.",
    )
    loading: ModelLoading | None = Field(
        None, description="How the weights are read at start (node-local staging, mmap)."
    )
    compile_cache: CompileCache | None = Field(
        None,
        description="Where generation.compile's compile cache lives when not on the model cache's volume "
        "(HF_HOME/muralist/compile-cache, spec.model.cache): a bucket's prefix, with its endpoint and "
        "credentials Secret.",
    )
    adapters: list[Adapter] = Field(
        default_factory=list, max_length=16,
        description="LoRA adapters applied on top of the model, each with its scale (several at once).",
    )
    fuse_adapters: bool = Field(
        False,
        description="Merge the adapters into the base weights after loading (faster steps, and needed with "
        "TensorParallel, which shards the base layers).",
    )
