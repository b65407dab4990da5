"""The compile cache: what torch.compile made for one size of one model, kept with the model cache, so that a
pod that starts again (restarted, resized, added) loads it instead of compiling again.

An entry is one file, `<HF_HOME>/muralist/compile-cache/<key>.tar` (HF_HOME is the model.cache volume in a
pod, so every pod of every job that mounts it shares the entries): torch's portable artifacts
(`torch.compiler.save_cache_artifacts`: inductor's FX graphs and AOTAutograd's, with a GPU's Triton kernels
bundled in) as `artifacts.bin`, the kernel binaries inductor built meanwhile that those artifacts do not carry
(the C++ kernels of a CPU: without them a warm start spends ~20 s in gcc again) under `kernels/`, and the key
spelled out (`key.json`). The key (`entry_key`) is a digest of everything that invalidates what was compiled:
torch, diffusers and Python versions, the model (source, revision, the transformer's architecture), dtype,
the call's size and batch, the device kind (a GPU's name and capability; a CPU's vector ISA, which inductor
compiles for), the compile options, and what changes the transformer's code (adapters, the step cache, the
parallel layout). Weights are not in it: a compiled graph takes them as inputs.

Written once, whole, by the first rank that compiled: to a temp name, then published with a hard link that
fails when the entry exists (`publish`), so a reader never sees half of one and a second writer leaves the
first's in place. A key that collides by mistake costs nothing wrong: inductor keys its own graphs and
compiles whatever the loaded artifacts do not match.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muralist_api.contract.env import PodEnv

log = logging.getLogger("muralist.compile")

ENTRY_FORMAT = 1  # bump when an entry's layout changes
ARTIFACTS = "artifacts.bin"
KERNELS = "kernels/"
KEY_FILE = "key.json"
# Inductor's own folders that the portable artifacts restore (or that hold only locks): never in an entry.
NOT_KERNELS = ("fxgraph", "aotautograd", "locks", "triton")


def cache_dir(env: dict[str, str] | None = None) -> Path:
    """Where entries live: MURALIST_COMPILE_CACHE, else under HF_HOME (the model.cache volume in a pod), else
    under the hub's default HF_HOME."""
    pod = PodEnv.from_environ(env)
    if pod.compile_cache_dir:
        return Path(pod.compile_cache_dir)
    return Path(pod.hf_home or os.path.expanduser("~/.cache/huggingface")) / "muralist" / "compile-cache"


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


def inductor_dir() -> Path:
    """The folder inductor compiles into (TORCHINDUCTOR_CACHE_DIR, or its default under the temp folder)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    return Path(inductor_cache_dir())


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
    path: Path

    @classmethod
    def at(cls, directory: Path, parts: dict[str, Any]) -> Entry:
        key = entry_key(parts)
        return cls(key, parts, directory / f"{key}.tar")


def load(entry: Entry, kernels_into: Path) -> bool:
    """Load an entry, if there is one: its kernels into inductor's folder, its artifacts into torch's caches.
    False when there is none, or it cannot be read (then the size compiles, as without a cache)."""
    import torch

    try:
        with tarfile.open(entry.path) as tar:
            artifacts = b""
            for member in tar.getmembers():
                if member.name == ARTIFACTS:
                    artifacts = _read(tar, member)
                elif member.name.startswith(KERNELS) and member.isfile():
                    _restore(tar, member, kernels_into)
    except FileNotFoundError:
        return False
    except (OSError, tarfile.TarError, ValueError) as e:
        log.warning("compile cache: cannot read %s (%s); compiling", entry.path, e)
        return False
    if artifacts:
        torch.compiler.load_cache_artifacts(artifacts)
    return True


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


def save(entry: Entry, kernels_from: Path, kernels: set[str]) -> bool:
    """Write the entry (torch's artifacts so far, `kernels` from inductor's folder) unless it exists; whether
    this call published it."""
    import torch

    if entry.path.exists():
        return False
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return False
    artifacts, _ = saved
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add(tar, KEY_FILE, json.dumps({"format": ENTRY_FORMAT, **entry.parts}, indent=1, sort_keys=True,
                                       default=str).encode())
        _add(tar, ARTIFACTS, artifacts)
        for name in sorted(kernels):
            path = kernels_from / name
            _add(tar, KERNELS + name, path.read_bytes(), path.stat().st_mode & 0o777)
    return publish(entry.path, buffer.getvalue())


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def publish(path: Path, data: bytes) -> bool:
    """`data` at `path`, whole, unless a file is there already (whoever links first wins); whether it was this."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
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
