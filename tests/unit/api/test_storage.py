"""Object storage's one opener (muralist_api/storage.py `open_location`): a URI with its section's endpoint, or a
path on this machine, as (fsspec file system, path); what the runtime's data sets, inputs and outputs and the
client's results open through."""

from __future__ import annotations

import ast
from pathlib import Path

from muralist_api.storage import is_uri, open_location, storage_options

from tests.paths import REPO
from tests.s3_plugin import S3Server


def test_a_uri_opens_its_bucket_at_the_sections_endpoint(s3_server: S3Server) -> None:
    bucket = s3_server.bucket()
    fs, path = open_location(f"s3://{bucket}/runs/june/", s3_server.endpoint, {"use_listings_cache": False})
    assert path == f"{bucket}/runs/june", "no protocol, no trailing '/'"
    assert fs.client_kwargs == {"endpoint_url": s3_server.endpoint} and not fs.dircache.use_listings_cache
    fs.pipe_file(f"{path}/a.txt", b"hello")
    assert s3_server.filesystem().cat_file(f"{bucket}/runs/june/a.txt") == b"hello", "the server's object"
    again, same = open_location(f"s3://{bucket}/runs/june", s3_server.endpoint)
    assert again.cat_file(f"{same}/a.txt") == b"hello"


def test_options_given_win_over_the_endpoints() -> None:
    mine = {"client_kwargs": {"endpoint_url": "http://mine:9000"}}
    fs, _ = open_location("s3://b/p", "http://minio.storage:9000", mine)
    assert fs.client_kwargs == {"endpoint_url": "http://mine:9000"}
    assert storage_options("gs://b", "http://gcs:4443") == {"endpoint_url": "http://gcs:4443"}, "gcsfs spells it so"


def test_a_path_opens_the_local_disk(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x.txt").write_bytes(b"local")
    fs, path = open_location(tmp_path / "out" / ".." / "out")
    assert path == str(tmp_path / "out") and fs.cat_file(f"{path}/x.txt") == b"local"
    assert not is_uri(tmp_path) and is_uri("memory://x") and not is_uri("relative/s3://x")


def imports_fsspec(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "fsspec" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fsspec":
            return True
    return False


def test_nothing_else_opens_fsspec() -> None:
    # The one opener: no product module but muralist_api/storage.py imports fsspec.
    opener = REPO / "api" / "muralist_api" / "storage.py"
    callers = [str(path.relative_to(REPO)) for root in ("api", "operator", "runtime", "cli")
               for path in sorted((REPO / root).rglob("*.py")) if path != opener and imports_fsspec(path.read_text())]
    assert not callers, f"open object storage through muralist_api.storage.open_location: {callers}"
    assert imports_fsspec(opener.read_text())
