"""hack/docker_layers.py replays a layer's tar from Docker's storage: its tar-split record is the recipe."""

from __future__ import annotations

import base64
import gzip
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import REPO


def _docker_layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docker_layers", REPO / "hack/docker_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


layers = _docker_layers()


def _segment(data: bytes) -> dict[str, object]:
    return {"type": layers.TAR_SPLIT_SEGMENT, "payload": base64.b64encode(data).decode()}


def _layer(tmp_path: Path, extra: list[dict[str, object]]) -> tuple[object, bytes]:
    """A one-file layer: its files, its tar, and a tar-split record (header, file, trailer)."""
    files = tmp_path / "diff"
    files.mkdir()
    content = b"hello, layer\n" * 100
    (files / "a.txt").write_bytes(content)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(files / "a.txt", arcname="a.txt")
    raw = buffer.getvalue()
    header_end = raw.index(content)
    entries = [_segment(raw[:header_end]), {"type": layers.TAR_SPLIT_FILE, "name": "a.txt", "size": len(content)},
               *extra, _segment(raw[header_end + len(content):])]
    record = tmp_path / "tar-split.json.gz"
    with gzip.open(record, "wt") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    return layers.Layer(diff_id="sha256:unused", files=files, tar_split=record), raw


def test_a_layer_replays_its_tar_byte_for_byte(tmp_path: Path) -> None:
    layer, raw = _layer(tmp_path, [])
    assert b"".join(layer.chunks()) == raw
    assert layer.size() == len(raw)


def test_an_entry_of_unknown_type_is_refused_not_skipped(tmp_path: Path) -> None:
    layer, _ = _layer(tmp_path, [{"type": 7, "name": "odd"}])
    with pytest.raises(layers.LayerMismatch, match="unknown type 7"):
        b"".join(layer.chunks())
    with pytest.raises(layers.LayerMismatch, match="unknown type 7"):
        layer.size()
