"""The compile cache: what torch.compile made for one size of one model, kept with the model cache, so that a
pod that starts again (restarted, resized, added) loads it instead of compiling again.

An entry is one file, `<HF_HOME>/muralist/compile-cache/<key>.tar` (HF_HOME is the model.cache volume in a pod, so
every pod of every job that mounts it shares the entries), or `<key>.tar` under spec.model.compileCache's bucket
prefix (shared by every job that names it): the precompiled functions of a transformer compiled whole
(precompiled.py) as `functions/<role>-<signature>.bin`, or, for one compiled by regions or inside a parallel group,
torch's portable artifacts (`torch.compiler.save_cache_artifacts`: inductor's FX graphs and AOTAutograd's, with a
GPU's Triton kernels bundled in) as `artifacts.bin`; the kernel binaries inductor built meanwhile that neither
carries (the C++ kernels of a CPU: without them a warm start spends ~20 s in gcc again; each rank compiles in a
folder of its own, `own_inductor_dir`, so that what it built is all they need) under `kernels/`; and the
key spelled out (`key.json`). The key (`entry_key`) is a digest of everything that invalidates what was compiled:
torch, diffusers and Python versions, the model (source, revision, the transformer's architecture), dtype, the
call's size and batch, the device kind (a GPU's name and capability; a CPU's vector ISA, which inductor compiles
for), the compile options, and what changes the transformer's code (adapters, the step cache, the parallel layout).
Weights are not in it: a compiled graph takes them as inputs.

Written once, whole, by the first rank that compiled: on a volume to a temp name, then published with a hard
link that fails when the entry exists (`publish`), so a reader never sees half of one and a second writer leaves
the first's in place; in a bucket by one PUT, which is whole (two ranks that compiled the same size at once may
both put theirs: either is the same entry). A key that collides by mistake costs nothing wrong: inductor keys its
own graphs and compiles whatever the loaded artifacts do not match, and a precompiled function serves only the
call signature it was made for.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import platform
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muralist_api.contract.env import PodEnv
from muralist_api.model import CompileCache
from muralist_api.storage import is_uri, join_uri, open_location

log = logging.getLogger("muralist.compile")

ENTRY_FORMAT = 3  # bump when an entry's layout changes (3: call signatures hold their tensors' strides)
ARTIFACTS = "artifacts.bin"
FUNCTIONS = "functions/"
KERNELS = "kernels/"
KEY_FILE = "key.json"
# Inductor's own folders that the portable artifacts restore (or that hold only locks): never in an entry.
NOT_KERNELS = ("fxgraph", "aotautograd", "locks", "triton")


@dataclass(frozen=True)
class Location:
    """Where entries live: a folder, or a URI (object storage) with its endpoint."""

    where: str
    endpoint: str | None = None

    def join(self, name: str) -> str:
        return join_uri(self.where, name) if is_uri(self.where) else os.path.join(self.where, name)


def cache_location(in_storage: CompileCache | None = None, env: dict[str, str] | None = None) -> Location:
    """spec.model.compileCache (a bucket's prefix) when set; else MURALIST_COMPILE_CACHE, else under HF_HOME (the
    model.cache volume in a pod), else under the hub's default HF_HOME."""
    if in_storage is not None:
        return Location(in_storage.uri, in_storage.endpoint)
    pod = PodEnv.from_environ(env)
    if pod.compile_cache_dir:
        return Location(pod.compile_cache_dir)
    return Location(str(Path(pod.hf_home or os.path.expanduser("~/.cache/huggingface")) / "muralist" / "compile-cache"))


def device_kind(gpu: bool) -> dict[str, Any]:
    """What the compiled kernels were built for."""
    import torch

    if gpu and torch.cuda.is_available():
        index = torch.cuda.current_device()
        return {"type": "cuda", "name": torch.cuda.get_device_name(index),
                "capability": list(torch.cuda.get_device_capability(index)), "cuda": torch.version.cuda}
    return {"type": "cpu", "machine": platform.machine(), "isa": cpu_isa()}


# The CPU features inductor's C++ kernels are compiled for (it builds with -march=native): what /proc/cpuinfo
# says of them, not inductor's own probe, which compiles test programs (seconds) in an empty inductor folder.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")


def cpu_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return []
    flags: set[str] = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
            break
    return [f for f in ISA_FLAGS if f in flags]


def model_identity(source: str, revision: str | None, transformer: Any) -> dict[str, Any]:
    """The model as far as compiled code depends on it: where it comes from and its transformer's architecture."""
    config = dict(getattr(transformer, "config", {}) or {})
    architecture = json.dumps({k: v for k, v in config.items() if not k.startswith("_")}, sort_keys=True, default=str)
    return {"source": source, "revision": revision, "class": type(transformer).__name__,
            "architecture": hashlib.sha256(architecture.encode()).hexdigest()[:32]}


def entry_key(parts: dict[str, Any]) -> str:
    """The entry's name: a digest of what invalidates it (`parts`, with the versions added by `key_parts`)."""
    text = json.dumps({"format": ENTRY_FORMAT, **parts}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def versions() -> dict[str, str]:
    import diffusers
    import torch

    return {"torch": torch.__version__, "diffusers": diffusers.__version__, "python": platform.python_version()}


def own_inductor_dir() -> Path:
    """A new, empty folder for inductor to compile into in this process (TORCHINDUCTOR_CACHE_DIR, and inductor's
    in-memory caches cleared): what a rank finds there, it built or restored itself, so the kernels it built are
    all the kernels its entry needs. In a shared folder (a pod's ranks share /tmp; a reused or mounted one) a rank
    used the kernels another had built without building them: its entry lacked them, and every pod that loaded
    it built them again (26 s a rank for the tiny Flux, while a cold compile took 14 s). The caller removes it."""
    from torch._inductor.utils import clear_caches

    folder = Path(tempfile.mkdtemp(prefix="muralist-inductor-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    clear_caches()
    return folder


def kernel_files(root: Path) -> set[str]:
    """The files of inductor's folder that an entry carries (relative paths): its kernels, not its graph caches."""
    found = set()
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if path.is_file() and relative.parts[0] not in NOT_KERNELS and not path.name.endswith(".lock"):
            found.add(relative.as_posix())
    return found


@dataclass(frozen=True)
class Entry:
    """One size's entry: its key, the parts it is the digest of, and where it lives."""

    key: str
    parts: dict[str, Any]
    location: Location

    @classmethod
    def at(cls, location: Location, parts: dict[str, Any]) -> Entry:
        return cls(entry_key(parts), parts, location)

    @property
    def path(self) -> str:
        return self.location.join(f"{self.key}.tar")


@dataclass
class Loaded:
    """What an entry gave: the precompiled functions it holds, by signature (empty for an artifacts entry), and the
    names of its kernels."""

    functions: dict[str, bytes] = field(default_factory=dict)
    kernels: set[str] = field(default_factory=set)


def load(entry: Entry, kernels_into: Path) -> Loaded | None:
    """Load an entry, if there is one: its kernels into inductor's folder, its artifacts into torch's caches, its
    functions returned. None when there is none, or it cannot be read (then the size compiles, as without a
    cache)."""
    import torch

    loaded = Loaded()
    try:
        data = read_entry(entry)
        if data is None:
            return None
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            artifacts = b""
            for member in tar.getmembers():
                if member.name == ARTIFACTS:
                    artifacts = _read(tar, member)
                elif member.name.startswith(FUNCTIONS) and member.name.endswith(".bin"):
                    loaded.functions[member.name[len(FUNCTIONS):-len(".bin")]] = _read(tar, member)
                elif member.name.startswith(KERNELS) and member.isfile():
                    _restore(tar, member, kernels_into)
                    loaded.kernels.add(member.name[len(KERNELS):])
    except (OSError, tarfile.TarError, ValueError) as e:
        log.warning("compile cache: cannot read %s (%s); compiling", entry.path, e)
        return None
    if artifacts:
        torch.compiler.load_cache_artifacts(artifacts)
    return loaded


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    stream = tar.extractfile(member)
    if stream is None:
        raise ValueError(f"{member.name} is not a file")
    return stream.read()


def _restore(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path) -> None:
    relative = Path(member.name[len(KERNELS):])
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ValueError(f"{member.name}: a path outside the kernels")
    target = root / relative
    if target.exists():
        return  # built or restored already: the same name is the same source
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(_read(tar, member))
    os.chmod(tmp, member.mode & 0o777 or 0o644)
    os.replace(tmp, target)


def save(entry: Entry, kernels_from: Path, kernels: set[str], functions: dict[str, bytes] | None = None,
         replace: bool = False) -> bool:
    """Write the entry unless it exists (or in its place: `replace`, for one that lacked what a rank had to build
    again): `functions` (precompiled, by signature) or else torch's artifacts so far, and `kernels` from inductor's
    folder; whether this call published it."""
    import torch

    try:
        if not replace and exists(entry):
            return False
    except OSError as e:
        log.warning("compile cache: cannot reach %s (%s)", entry.path, e)
        return False
    artifacts = b""
    if not functions:
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return False
        artifacts = saved[0]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add(tar, KEY_FILE, json.dumps({"format": ENTRY_FORMAT, **entry.parts}, indent=1, sort_keys=True,
                                       default=str).encode())
        if artifacts:
            _add(tar, ARTIFACTS, artifacts)
        for sig, data in sorted((functions or {}).items()):
            _add(tar, f"{FUNCTIONS}{sig}.bin", data)
        for name in sorted(kernels):
            path = kernels_from / name
            _add(tar, KERNELS + name, path.read_bytes(), path.stat().st_mode & 0o777)
    try:
        return publish_entry(entry, buffer.getvalue(), replace)
    except OSError as e:  # a full volume, a bucket that refuses: the job goes on, the next pod compiles again
        log.warning("compile cache: cannot write %s (%s)", entry.path, e)
        return False


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def read_entry(entry: Entry) -> bytes | None:
    """The entry's bytes; None when there is none."""
    fs, path = open_location(entry.path, entry.location.endpoint)
    try:
        data: bytes = fs.cat_file(path)
    except FileNotFoundError:
        return None
    return data


def exists(entry: Entry) -> bool:
    fs, path = open_location(entry.path, entry.location.endpoint)
    return bool(fs.exists(path))


def publish_entry(entry: Entry, data: bytes, replace: bool = False) -> bool:
    """The entry's bytes put in place, whole; whether this call put them. On a volume, once (`publish`: a second
    writer leaves the first's) unless `replace`; in object storage a PUT is whole, and two ranks that compiled the
    same size at once may both put theirs (`save` looked first): either is the same entry."""
    if not is_uri(entry.path):
        return publish(Path(entry.path), data, replace)
    fs, path = open_location(entry.path, entry.location.endpoint)
    fs.pipe_file(path, data)
    return True


def publish(path: Path, data: bytes, replace: bool = False) -> bool:
    """`data` at `path`, whole, unless a file is there already (whoever links first wins; `replace`: in its place,
    by a rename); whether it was this."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: a rename, unless one was published meanwhile
            if path.exists():
                return False
            os.replace(tmp, path)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
