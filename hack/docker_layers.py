"""A local Docker image as an OCI archive for `ctr images import`, holding only the layers an
image store lacks, read straight from the Docker engine's overlay2 storage. Standard library only.

`docker save` (Docker 20.10, Debian's) first copies every layer of the image into a temporary
folder and only then streams it: for the 6.7 GB runtime image that is minutes, on every change of
its few-MB code layer. Docker keeps, beside each layer's files, the tar-split record of the tar
it was made from (headers and padding verbatim, file contents by name); replaying it over the
layer's `diff` folder gives back that tar byte for byte, which is what `docker save` itself
does. So a changed image costs the layers that changed, and every layer sent is checked against
its digest (`rootfs.diff_ids` of the image's config) by the importer's reader here.

    image = LocalImage.inspect("muralist-runtime:dev")   # None: not overlay2, or not readable here
    sent = image.write_oci(ctr_import_stdin, "docker.io/library/muralist-runtime:dev", present=digests)
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar"
# tar-split's entry types (github.com/vbatts/tar-split, tar/storage/entry.go).
TAR_SPLIT_FILE, TAR_SPLIT_SEGMENT = 1, 2
CHUNK = 1 << 20


class LayerMismatch(RuntimeError):
    """A layer replayed from Docker's storage is not the layer its image names."""


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The chain ID of each layer (OCI image spec): where Docker (and containerd) keep it."""
    out = [diff_ids[0]]
    for diff_id in diff_ids[1:]:
        out.append("sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest())
    return out


def _payload(entry: dict[str, Any]) -> bytes:
    return base64.b64decode(str(entry.get("payload") or ""))


@dataclass(frozen=True)
class Layer:
    diff_id: str
    files: Path  # the layer's own files: overlay2's `diff` folder
    tar_split: Path  # how they were laid out in the layer's tar

    def _entries(self) -> Iterator[dict[str, Any]]:
        with gzip.open(self.tar_split, "rt") as f:
            for line in f:
                entry = json.loads(line)
                if entry["type"] not in (TAR_SPLIT_FILE, TAR_SPLIT_SEGMENT):
                    raise LayerMismatch(f"{self.tar_split}: a tar-split entry of unknown type {entry['type']!r}")
                yield entry

    def size(self) -> int:
        """The tar's length in bytes, from the record alone."""
        return sum(len(_payload(e)) if e["type"] == TAR_SPLIT_SEGMENT else int(e.get("size") or 0)
                   for e in self._entries())

    def chunks(self) -> Iterator[bytes]:
        """The layer's tar, byte for byte as it was built."""
        for e in self._entries():
            if e["type"] == TAR_SPLIT_SEGMENT:
                yield _payload(e)
                continue
            left = int(e.get("size") or 0)
            if not left:
                continue
            raw = e.get("name_raw")
            name = base64.b64decode(str(raw)).decode("utf-8", "surrogateescape") if raw else str(e["name"])
            with open(self.files / name, "rb") as f:
                while left:
                    block = f.read(min(CHUNK, left))
                    if not block:
                        raise LayerMismatch(f"{self.files / name}: shorter than its tar entry")
                    left -= len(block)
                    yield block


class _Verified:
    """A layer's tar as a readable stream that checks, with its last byte, the layer's digest."""

    def __init__(self, layer: Layer, size: int) -> None:
        self._layer, self._left = layer, size
        self._chunks = layer.chunks()
        self._chunk, self._at = b"", 0
        self._hash = hashlib.sha256()

    def read(self, n: int) -> bytes:
        parts, wanted = [], n
        while wanted:
            if self._at == len(self._chunk):
                self._chunk, self._at = next(self._chunks, b""), 0
                if not self._chunk:
                    break
            part = self._chunk[self._at:self._at + wanted]
            self._at += len(part)
            wanted -= len(part)
            parts.append(part)
        out = b"".join(parts)
        self._hash.update(out)
        self._left -= len(out)
        if self._left <= 0 and "sha256:" + self._hash.hexdigest() != self._layer.diff_id:
            raise LayerMismatch(f"layer {self._layer.diff_id} replayed from {self._layer.files} differs")
        return out


def _add(tar: tarfile.TarFile, name: str, size: int, stream: IO[bytes] | _Verified) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    tar.addfile(info, stream)  # type: ignore[arg-type]


@dataclass(frozen=True)
class LocalImage:
    image_id: str
    config: bytes
    layers: list[Layer]

    @classmethod
    def inspect(cls, name: str, docker: str = "docker") -> LocalImage | None:
        """The image as Docker stores it; None where its storage cannot be read here (a driver
        other than overlay2, a remote engine, not root)."""
        info = subprocess.run([docker, "info", "--format", "{{.Driver}} {{.DockerRootDir}}"],
                              capture_output=True, text=True)
        image = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", name],
                               capture_output=True, text=True)
        if info.returncode or image.returncode:
            return None
        driver, _, root_dir = info.stdout.strip().partition(" ")
        if driver != "overlay2":
            return None
        root, image_id = Path(root_dir), image.stdout.strip()
        store = root / "image" / driver
        try:
            config = (store / "imagedb/content/sha256" / image_id.removeprefix("sha256:")).read_bytes()
            if "sha256:" + hashlib.sha256(config).hexdigest() != image_id:
                return None
            diff_ids = json.loads(config)["rootfs"]["diff_ids"]
            layers = []
            for diff_id, chain_id in zip(diff_ids, chain_ids(diff_ids), strict=True):
                meta = store / "layerdb/sha256" / chain_id.removeprefix("sha256:")
                if (meta / "diff").read_text().strip() != diff_id:
                    return None
                cache_id = (meta / "cache-id").read_text().strip()
                layers.append(Layer(diff_id, root / driver / cache_id / "diff", meta / "tar-split.json.gz"))
        except (OSError, ValueError, KeyError):
            return None
        return cls(image_id, config, layers)

    def write_oci(self, out: IO[bytes], ref: str, present: set[str]) -> int:
        """An OCI image layout archive (streamed) naming the image `ref`, holding the layers whose
        digests are not `present` (in the image store already); how many it holds. Raises
        LayerMismatch, part-way, if a layer replays to other bytes than its digest."""
        sizes = {layer.diff_id: layer.size() for layer in self.layers}
        missing = [layer for layer in self.layers if layer.diff_id not in present]
        manifest = json.dumps({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": self.image_id, "size": len(self.config)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": layer.diff_id, "size": sizes[layer.diff_id]}
                       for layer in self.layers],
        }).encode()
        index = json.dumps({
            "schemaVersion": 2,
            "manifests": [{"mediaType": MANIFEST_TYPE, "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
                           "size": len(manifest), "annotations": {"io.containerd.image.name": ref}}],
        }).encode()
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            tar.copybufsize = CHUNK
            for name, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index),
                               (f"blobs/sha256/{hashlib.sha256(manifest).hexdigest()}", manifest),
                               (f"blobs/sha256/{self.image_id.removeprefix('sha256:')}", self.config)):
                _add(tar, name, len(data), io.BytesIO(data))
            for layer in missing:
                size = sizes[layer.diff_id]
                _add(tar, f"blobs/sha256/{layer.diff_id.removeprefix('sha256:')}", size, _Verified(layer, size))
        return len(missing)
