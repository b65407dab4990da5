"""A stand-in for the Hugging Face Hub's file API on loopback, so tests run the real client.

The runtime reaches the hub only through `huggingface_hub` (its own calls, and diffusers'
from_pretrained and load_lora_weights), which sends every request to HF_ENDPOINT. Pointed at
this server, that client code runs for real: revisions resolve to commits, tokens travel in
headers, downloads are cached, resumed and refused exactly as against huggingface.co.

It serves, from local folders, the part of the hub's HTTP API that huggingface_hub 2.x uses
for model repos (read in file_download.py, _snapshot_download.py, hf_api.py, utils/_http.py):

- `GET /api/models/{repo}[/revision/{rev}]`: the repo's info: `sha` (the commit the revision
  resolves to), `siblings`, `gated`. Public even for a gated repo, as on the hub.
- `GET /api/models/{repo}/tree/{rev}[/{path}]`: its files and folders (`type`, `path`, `size`,
  `oid`, and `lfs` for weight files), in one page.
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: a small file, with `X-Repo-Commit` and `ETag` (its
  git blob id), Range supported (`bytes=N-` and `bytes=N-M`, the range alone read from the file);
  a weight file (`.safetensors`) answers `302` to the "CDN" with `X-Linked-Etag` (its sha256) and
  `X-Linked-Size`, as the hub does for LFS files.
- `GET /cdn/{repo}/{sha256}`: the bytes of a weight file, Range supported (the safetensors
  metadata reads of `HfApi.parse_safetensors_file_metadata` ask for the first 100 kB). The CDN is
  this same server under the name `localhost`: another host to the client, which therefore sends
  no Authorization header there (the hub's signed CDN URLs take none either). A file over
  HASHED_WHOLE_MAX is a sparse test file (tests/planner_models.py): its ids come from its size and
  first bytes.

Refusals carry the hub's `X-Error-Code`, from which the client raises its exceptions:
`RepoNotFound` (401 without a token, 404 with one), `RevisionNotFound` (404), `EntryNotFound`
(404, with `X-Repo-Commit`), `GatedRepo` (401 without a token, 403 with a token whose account
has no access); a token it does not know gets 401 "Invalid credentials in Authorization header".

Faults: `drop(count, ...)` cuts the body of the next `count` file downloads after some bytes
and closes the connection (the client sees an incomplete body and asks again, with Range for
what it already has).
Every request is recorded (`requests`: method, repo, revision, file, Authorization, Range,
status) for assertions. Standard library only; one thread per connection.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".ckpt")
# Files above this are hashed by their size and first bytes only (the sparse model folders of the planner's tests).
HASHED_WHOLE_MAX = 64 << 20
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


@dataclass(frozen=True)
class RepoFile:
    path: str  # inside the repo, '/'-separated
    local: Path
    size: int
    oid: str  # git blob id: what the hub's ETag is for a file in git
    sha256: str  # what it is for a file in LFS

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.oid

    @classmethod
    def of(cls, path: str, local: Path) -> RepoFile:
        size = local.stat().st_size
        if size > HASHED_WHOLE_MAX:
            # A sparse weight file (tests/planner_models.py): gigabytes of a hole behind its header. Its ids
            # are taken from its size and first bytes; only its header is ever read.
            with local.open("rb") as f:
                head = f.read(1 << 20)
            ident = b"sparse %d\0" % size + head
            return cls(path, local, size, hashlib.sha1(ident).hexdigest(), hashlib.sha256(ident).hexdigest())
        data = local.read_bytes()
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return cls(path, local, len(data), oid, hashlib.sha256(data).hexdigest())


@dataclass
class Repo:
    commits: dict[str, dict[str, RepoFile]]  # commit sha -> files by path
    refs: dict[str, str]  # branch or tag -> commit sha
    gated: bool = False

    def resolve(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        return revision if revision in self.commits else None


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    kind: str  # "info", "tree", "resolve", "cdn" or "unknown"
    path: str
    repo: str | None = None
    revision: str | None = None  # as asked (a branch, a tag or a commit)
    file: str | None = None
    authorization: str | None = None
    range: str | None = None
    status: int = 0
    dropped: bool = False

    @property
    def downloads(self) -> bool:
        """Whether this request carried file bytes (a body GET that was answered with them)."""
        return self.method == "GET" and self.status in (200, 206) and self.kind in ("resolve", "cdn")


@dataclass
class Fault:
    count: int  # downloads still to cut
    after_bytes: int | None  # None: half of what the response would send
    file: str | None  # only downloads of this repo path


@dataclass
class HubServer:
    """The stand-in. `start()` serves on `sock` (bound, not yet listening) or on a free port."""

    sock: socket.socket | None = None
    tokens: dict[str, bool] = field(default_factory=dict)  # token -> may read gated repos
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- setting it up ---------------------------------------------------------------------------

    def start(self) -> HubServer:
        sock = self.sock or socket.socket()
        if self.sock is None:
            sock.bind(("127.0.0.1", 0))
        self._httpd = _Server(sock, self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-stand-in", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_repo(self, repo_id: str, commits: Sequence[Path], *, tags: dict[str, int] | None = None,
                 gated: bool = False) -> list[str]:
        """Serve folders as the commits of `repo_id`, oldest first; `main` is the last one.

        Returns the commit shas (40 hex digits, derived from the files: a folder is the same
        commit in every session and in every repo that serves it, as a copied git history is).
        `tags`: name -> index into `commits`.
        """
        files_by_commit: dict[str, dict[str, RepoFile]] = {}
        shas = []
        for folder in commits:
            files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
                     if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}
            entries = {path: RepoFile.of(path, local) for path, local in files.items()}
            digest = hashlib.sha1(b"".join(f"{p}:{e.oid}\n".encode() for p, e in entries.items()))
            sha = digest.hexdigest()
            files_by_commit[sha] = entries
            shas.append(sha)
        refs = {"main": shas[-1], **{name: shas[i] for name, i in (tags or {}).items()}}
        with self._lock:
            self.repos[repo_id] = Repo(files_by_commit, refs, gated)
        return shas

    def drop(self, count: int = 1, after_bytes: int | None = None, file: str | None = None) -> None:
        """Cut the next `count` downloads (of `file` only, if given) after `after_bytes` bytes of
        the body (default: half), closing the connection."""
        with self._lock:
            self.faults.append(Fault(count, after_bytes, file))

    def reset(self) -> None:
        """Forget the recorded requests and pending faults (the repos stay)."""
        with self._lock:
            self.requests.clear()
            self.faults.clear()

    # -- what it saw ----------------------------------------------------------------------------

    def seen(self, repo: str | None = None, kind: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if (repo is None or r.repo == repo) and (kind is None or r.kind == kind)]

    def downloads(self, repo: str | None = None) -> list[Request]:
        """The requests that carried file bytes, in order."""
        return [r for r in self.seen(repo) if r.downloads]

    # -- answering ------------------------------------------------------------------------------

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _take_fault(self, file: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.count > 0 and fault.file in (None, file):
                    fault.count -= 1
                    return fault
        return None

    def handle(self, h: _Handler, method: str) -> None:
        url = urlsplit(h.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        request = Request(method, "unknown", url.path, authorization=h.headers.get("Authorization"),
                          range=h.headers.get("Range"))
        # Recorded before it is answered (and filled in on the way): a client that has its
        # answer finds its request in the log.
        self._record(request)
        self._route(h, request, parts, parse_qs(url.query))

    def _route(self, h: _Handler, request: Request, parts: list[str], query: dict[str, list[str]]) -> None:
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            request.repo, rest = f"{parts[2]}/{parts[3]}", parts[4:]
            if not rest:
                request.kind, request.revision = "info", "main"
            elif rest[0] == "revision" and len(rest) == 2:
                request.kind, request.revision = "info", rest[1]
            elif rest[0] == "tree" and len(rest) >= 2:
                request.kind, request.revision, request.file = "tree", rest[1], "/".join(rest[2:])
            else:
                return self._send(h, request, 404, {}, b"")
            return self._api(h, request, query)
        if parts[:1] == ["cdn"] and len(parts) == 4:
            request.kind, request.repo = "cdn", f"{parts[1]}/{parts[2]}"
            request.file = (query.get("file") or [None])[0]
            return self._cdn(h, request, parts[3])
        if len(parts) >= 5 and parts[2] == "resolve":
            request.kind, request.repo = "resolve", f"{parts[0]}/{parts[1]}"
            request.revision, request.file = parts[3], "/".join(parts[4:])
            return self._resolve(h, request)
        return self._send(h, request, 404, {}, b"")

    def _token(self, h: _Handler) -> tuple[str | None, bool]:
        """(the bearer token or None, whether the server accepts it)."""
        auth = h.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ").strip() or None
        return token, token is None or token in self.tokens

    def _refuse(self, h: _Handler, request: Request, status: int, code: str | None, message: str,
                headers: dict[str, str] | None = None) -> None:
        extra = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {}), **(headers or {})}
        self._send(h, request, status, extra, json.dumps({"error": message}).encode(), "application/json")

    def _repo_and_commit(self, h: _Handler, request: Request) -> tuple[Repo, str] | None:
        """The repo and the commit a request names, or None once it has been refused."""
        token, known = self._token(h)
        if not known:
            self._refuse(h, request, 401, None, INVALID_CREDENTIALS)
            return None
        repo = self.repos.get(request.repo or "")
        if repo is None:
            self._refuse(h, request, 401 if token is None else 404, "RepoNotFound", "Repository not found")
            return None
        sha = repo.resolve(request.revision or "main")
        if sha is None:
            self._refuse(h, request, 404, "RevisionNotFound", f"Invalid rev id: {request.revision}")
            return None
        return repo, sha

    def _api(self, h: _Handler, request: Request, query: dict[str, list[str]]) -> None:
        found = self._repo_and_commit(h, request)
        if found is None:
            return
        repo, sha = found
        files = repo.commits[sha]
        if request.kind == "info":
            body: Any = {"_id": sha[:24], "id": request.repo, "modelId": request.repo, "sha": sha,
                         "private": False, "disabled": False, "gated": "manual" if repo.gated else False,
                         "library_name": "diffusers", "tags": [], "lastModified": "2026-01-01T00:00:00.000Z",
                         "siblings": [{"rfilename": path} for path in files]}
        else:
            recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
            body = list(_tree(files, request.file or "", recursive))
        self._send(h, request, 200, {}, json.dumps(body).encode(), "application/json")

    def _resolve(self, h: _Handler, request: Request) -> None:
        found = self._repo_and_commit(h, request)
        if found is None:
            return
        repo, sha = found
        token, _ = self._token(h)
        if repo.gated and token is None:
            return self._refuse(h, request, 401, "GatedRepo", f"Access to model {request.repo} is restricted. You "
                                "must have access to it and be authenticated to access it. Please log in.")
        if repo.gated and not self.tokens[token or ""]:
            return self._refuse(h, request, 403, "GatedRepo", f"Access to model {request.repo} is restricted and "
                                "you are not in the authorized list.")
        entry = repo.commits[sha].get(request.file or "")
        if entry is None:
            return self._refuse(h, request, 404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "ETag": f'"{entry.oid}"'}
        if entry.lfs:
            host = f"http://localhost:{self.port}"
            location = f"{host}/cdn/{quote(request.repo or '')}/{entry.sha256}?file={quote(entry.path)}"
            headers.update({"Location": location, "X-Linked-Etag": f'"{entry.sha256}"',
                            "X-Linked-Size": str(entry.size)})
            return self._send(h, request, 302, headers, b"")
        self._send_file(h, request, entry, headers)

    def _cdn(self, h: _Handler, request: Request, sha256: str) -> None:
        repo = self.repos.get(request.repo or "")
        entry = next((f for files in (repo.commits.values() if repo else []) for f in files.values()
                      if f.sha256 == sha256), None)
        if entry is None:
            return self._send(h, request, 404, {}, b"")
        self._send_file(h, request, entry, {"ETag": f'"{entry.sha256}"'})

    def _send_file(self, h: _Handler, request: Request, entry: RepoFile, headers: dict[str, str]) -> None:
        size = entry.size
        start, end, status = _range(request.range, size)
        if status == 416:
            return self._send(h, request, 416, {"Content-Range": f"bytes */{size}"}, b"")
        with entry.local.open("rb") as f:  # the range alone: a sparse file's header, not its gigabytes
            f.seek(start)
            body = f.read(end + 1 - start)
        headers = {**headers, "Accept-Ranges": "bytes"}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        fault = self._take_fault(entry.path) if request.method == "GET" else None
        if fault is None:
            return self._send(h, request, status, headers, body)
        # Cut: the headers promise the whole body, then the connection closes part way.
        request.dropped = True
        sent = len(body) // 2 if fault.after_bytes is None else min(fault.after_bytes, len(body) - 1)
        self._send(h, request, status, {**headers, "Content-Length": str(len(body))}, body[:sent])
        h.close_connection = True
        try:
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, h: _Handler, request: Request, status: int, headers: dict[str, str], body: bytes,
              content_type: str = "application/octet-stream") -> None:
        request.status = status
        h.send_response(status)
        headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **headers}
        for name, value in headers.items():
            h.send_header(name, value)
        h.end_headers()
        if request.method != "HEAD":
            h.wfile.write(body)


def _tree(files: dict[str, RepoFile], under: str, recursive: bool) -> Iterable[dict[str, Any]]:
    """The hub's tree listing of `under`: folders, then files."""
    prefix = f"{under.strip('/')}/" if under.strip("/") else ""
    folders: set[str] = set()
    listed = []
    for path, entry in files.items():
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix):].split("/")
        for depth in range(1, len(rest)):
            if depth == 1 or recursive:
                folders.add(prefix + "/".join(rest[:depth]))
        if len(rest) == 1 or recursive:
            listed.append(entry)
    for folder in sorted(folders):
        yield {"type": "directory", "path": folder, "oid": hashlib.sha1(folder.encode()).hexdigest()}
    for entry in listed:
        item: dict[str, Any] = {"type": "file", "path": entry.path, "size": entry.size, "oid": entry.oid}
        if entry.lfs:
            item["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": 134}
        yield item


def _range(header: str | None, size: int) -> tuple[int, int, int]:
    """(first byte, last byte, status) for a `Range: bytes=N-` or `bytes=N-M` header."""
    if not header or not header.startswith("bytes="):
        return 0, size - 1, 200
    first, _, last = header.removeprefix("bytes=").partition("-")
    start = int(first) if first.isdigit() else 0
    if start >= size:
        return 0, size - 1, 416
    end = min(int(last), size - 1) if last.isdigit() else size - 1
    return start, end, 206


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    server: _Server

    def do_GET(self) -> None:
        self.server.hub.handle(self, "GET")

    def do_HEAD(self) -> None:
        self.server.hub.handle(self, "HEAD")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is HubServer.requests


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, sock: socket.socket, hub: HubServer):
        super().__init__(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.server_address = sock.getsockname()[:2]
        self.hub = hub
        self.server_activate()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a connection cut on purpose (HubServer.drop) or by the client
