"""Where a job's data lives: a mounted volume, or object storage named by a URI.

`spec.dataset`, `spec.inputs` and `spec.output` each take exactly one of `volume` (a Kubernetes
VolumeSource, mounted) and `uri` (`s3://bucket/prefix`, `gs://`, `az://`, any fsspec protocol; read
and written by range and whole objects, never mounted). A URI may name a Secret whose keys become the
pods' environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...: what the protocol's client reads;
none: the node's or the service account's own identity, IRSA or workload identity) and an endpoint
for S3-compatible stores (MinIO, Ceph).

Every reader and writer of object storage (the runtime's data sets, inputs and outputs, the client's
results) opens it through `open_location`: the URI with its section's endpoint, fsspec imported there
(the runtime and client extras install it; the operator never opens a URI).

The rules of one section (one of volume and uri, credentials and endpoint only with a uri) are a
Python rule here (`location_problems`), mirrored by the CEL rules each section declares
(`location_rules`); one Secret per job, since its keys become the pods' environment, is a rule across
the sections (job.py's `credentials_problems`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import Field

from muralist_api.base import ApiModel, KubeObject
from muralist_api.cel import CelRule, python_rule
from muralist_api.contract.pod import STORAGE_CREDENTIALS_DIR
from muralist_api.rules.catalog import Problem

# A URI with a protocol and something after it: s3://bucket, gs://bucket/prefix, az://container/x.
URI_PATTERN = r"^[a-z][a-z0-9+.-]*://[^/]"
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# Protocols whose endpoint option fsspec's implementation spells `endpoint_url` (s3fs in its
# client_kwargs, gcsfs directly); others take their own options from the environment.
S3_PROTOCOLS = ("s3", "s3a")
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")


def join_uri(uri: str, path: str) -> str:
    """`path` (relative, no '..': validated) under a URI's prefix."""
    path = path.strip("/")
    if path in ("", "."):
        return uri.rstrip("/")
    return f"{uri.rstrip('/')}/{path}"


def protocol(uri: str) -> str:
    return uri.split("://", 1)[0]


def storage_options(uri: str, endpoint: str | None) -> dict[str, object]:
    """fsspec's options for a URI: the endpoint override only; credentials come from the env."""
    if endpoint is None:
        return {}
    if protocol(uri) in S3_PROTOCOLS:
        return {"client_kwargs": {"endpoint_url": endpoint}}
    return {"endpoint_url": endpoint}


def is_uri(location: str | os.PathLike[str]) -> bool:
    """Whether a location is a URI (object storage) rather than a path on this machine."""
    return bool(_URI.match(os.fspath(location)))


def open_location(location: str | os.PathLike[str], endpoint: str | None = None,
                  options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """(an fsspec file system, the location's path on it): object storage for a URI, with the section's
    `endpoint` (`storage_options`; credentials come from the environment), else the local disk (the path
    made absolute). `options`: more of fsspec's storage options for the protocol, over the endpoint's (a
    caller's own, e.g. `use_listings_cache`). The path has no protocol and no trailing '/'."""
    import fsspec

    if not is_uri(location):
        return fsspec.filesystem("file"), str(Path(location).resolve())
    uri = os.fspath(location)
    fs, path = fsspec.core.url_to_fs(uri, **{**storage_options(uri, endpoint), **(options or {})})
    return fs, str(path).rstrip("/")


class Section(Protocol):
    """A section that takes a volume or a uri: spec.dataset, spec.inputs (data.py) or spec.output (output.py)."""

    @property
    def section(self) -> str: ...

    @property
    def volume(self) -> KubeObject | None: ...

    @property
    def uri(self) -> str | None: ...

    @property
    def credentials_secret(self) -> str | None: ...

    @property
    def endpoint(self) -> str | None: ...


@python_rule()
def location_problems(section: Section) -> list[Problem]:
    """A volume or a uri (spec.output: at most one, an emptyDir when neither); credentials and endpoint
    only with a uri."""
    out: list[Problem] = []
    name = section.section
    volume_required = name != "spec.output"
    if section.volume is not None and section.uri is not None:
        out.append((name, "set volume or uri, not both" + ("" if volume_required else " (neither: an emptyDir)")))
    elif volume_required and section.volume is None and section.uri is None:
        out.append((name, "set exactly one of volume (a mounted VolumeSource) and uri (object storage, e.g. "
                          "s3://bucket/prefix)"))
    if section.uri is None:
        for field, value in (("credentialsSecret", section.credentials_secret), ("endpoint", section.endpoint)):
            if value is not None:
                out.append((f"{name}.{field}", f"goes with {name}.uri; set uri or remove {field}"))
    return out


def location_rules(section: str, volume_required: bool) -> tuple[CelRule, ...]:
    """The CEL rules of one section that takes a volume or a uri (`self` is the section)."""
    one = (CelRule("has(self.volume) != has(self.uri)",
                   f"{section}: set exactly one of volume (a mounted VolumeSource) and uri (object storage, e.g. "
                   "s3://bucket/prefix)", mirrors=location_problems)
           if volume_required else
           CelRule("!(has(self.volume) && has(self.uri))",
                   f"{section}: set volume or uri, not both (neither: an emptyDir)",
                   mirrors=location_problems))
    return (
        one,
        CelRule("has(self.uri) || (!has(self.credentialsSecret) && !has(self.endpoint))",
                f"{section}.credentialsSecret and {section}.endpoint go with {section}.uri; set uri or remove them",
                mirrors=location_problems),
    )


class StoredAt(ApiModel):
    """The fields a section that lives in object storage adds beside its `volume`."""

    # The section's path in a manifest, for messages (spec.dataset, ...).
    section: ClassVar[str] = ""

    uri: str | None = Field(
        None, max_length=2048, pattern=URI_PATTERN,
        description="Object storage instead of a volume: s3://bucket/prefix, gs://, az://, or any fsspec "
        "protocol (the runtime image has s3fs). Read by range and written as whole objects, never mounted.",
    )
    credentials_secret: str | None = Field(
        None, max_length=253, pattern=SECRET_NAME_PATTERN,
        description="A Secret in the job's namespace whose keys become the pods' environment (e.g. "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) and, one file per key, " + STORAGE_CREDENTIALS_DIR + " "
        "(a GCS key: key.json and GOOGLE_APPLICATION_CREDENTIALS pointing to it); default none: the pods' own "
        "identity (IRSA, workload identity). One Secret per job: every section that sets one sets the same.",
    )
    endpoint: str | None = Field(
        None, max_length=2048, pattern=r"^https?://[^/]",
        description="The object store's endpoint, for S3-compatible stores (MinIO, Ceph): e.g. "
        "http://minio.storage:9000.",
    )

    def options(self) -> dict[str, object]:
        """fsspec storage options for `uri`."""
        return storage_options(self.uri or "", self.endpoint)
