"""Ranks forked from a warm interpreter (the zygote), so that a pod pays torch's imports once, and early.

A rank's process spends ~4 s (5 s with the cyclic collector running: `collector_paused`) importing torch,
diffusers and transformers before it reads its spec, and under `muralist run` or in a pod it only starts after
the launch entry point, the launcher agent and torchrun's rendezvous (~2 s more, the agent importing torch
meanwhile). So the launch entry
point of a CPU pod starts a zygote first thing (`start`: `python -m muralist_runtime.world.zygote SOCKET
MODULE...`), which listens at once, imports those libraries and the runtime's modules beside the agent, and
serves. A rank started with MURALIST_ZYGOTE in its environment (`__main__.py` asks `delegate()` first; it
waits while the zygote is still importing) hands the zygote its argv, environment, working directory and
standard streams; the zygote forks a child that runs the rank from there, exactly as `python -m
muralist_runtime` would, and the rank's own process, the one torchrun started and watches, passes signals on to
the child and ends as it ended (same code, or killed by the same signal). If that process is killed, the child
kills itself (it watches a pipe only that process holds open). The zygote ends with its parent.

The rank starts the ordinary way whenever the zygote cannot serve it: no socket, MURALIST_ZYGOTE=off, or an
environment variable that a library reads at import time differs from the zygote's (a hub test's HF_HOME, a
benchmark's thread settings): the imports the zygote did would not be the ones the rank asked for. A GPU pod
starts its ranks the ordinary way: a fork after a library has touched the CUDA driver cannot use the GPU, and
that has not been measured on a GPU yet.

The test session starts one zygote per test worker (`started`) and hands its socket to every rank it starts, so
that the suite pays the imports once per worker.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a rank's process imports this module before anything else: no API package at run time
    from muralist_api.runtime_spec import RuntimeSpec

# A pod variable of the launch entry point (launch.py) for its ranks: the zygote's socket, or "off". Spelled here,
# not in the API's contract, so that a rank's process delegates before it imports anything (the API: 0.3 s).
ZYGOTE_ENV = "MURALIST_ZYGOTE"
OFF = "off"
# Read by torch, the hub client, transformers, diffusers and the BLAS/OpenMP runtimes when they are
# imported: a rank whose values differ starts the ordinary way. torchrun's own per-worker variables
# (TORCHELASTIC_*, TORCH_NCCL_*, TORCHINDUCTOR_CACHE_DIR) are read when the rank runs, so they may differ.
IMPORT_TIME_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "DIFFUSERS_", "TOKENIZERS_", "OMP_", "MKL_",
                        "OPENBLAS_", "PYTHON", "PYTORCH_", "TORCH_LOGS", "TORCH_COMPILE",
                        "CUDA_", "LD_", "XDG_", "HOME")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_HEADER = struct.Struct("!I")


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    packet = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [packet], fds)
    else:
        sock.sendall(packet)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the zygote connection closed")
        data += chunk
    return data


def _receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    fds: list[int] = []
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
        if not head:
            raise EOFError("the zygote connection closed")
        head += _recv_exact(sock, _HEADER.size - len(head))
    else:
        head = _recv_exact(sock, _HEADER.size)
    (size,) = _HEADER.unpack(head)
    return json.loads(_recv_exact(sock, size)), fds


def import_time_mismatch(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The import-time variables whose values differ between two environments."""
    keys = {k for k in (*ours, *theirs) if k.startswith(IMPORT_TIME_PREFIXES)} - {ZYGOTE_ENV}
    return sorted(k for k in keys if ours.get(k) != theirs.get(k))


# --- the rank's side ------------------------------------------------------------------------------

def delegate(module: str = "muralist_runtime") -> None:
    """Run this rank (`python -m module`, with this process's argv) in a child of the zygote and
    end as it ends; return (and start the ordinary way) when there is no zygote or it declines
    this environment."""
    path = os.environ.get(ZYGOTE_ENV)
    if not path or path == OFF:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return
    alive_r, alive_w = os.pipe()  # the child's watch on this process: EOF when it is gone
    env = {k: v for k, v in os.environ.items() if k != ZYGOTE_ENV}
    _send(sock, {"module": module, "argv": sys.argv, "path": sys.path, "env": env, "cwd": os.getcwd()},
          [0, 1, 2, alive_r])
    os.close(alive_r)
    reply, _ = _receive(sock)
    if "refused" in reply:
        sock.close()
        os.close(alive_w)
        return
    child = int(reply["pid"])

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    try:
        status, _ = _receive(sock)
    except (EOFError, OSError):
        os._exit(1)  # the zygote died: the child goes with this process (its pipe closes)
    if "exit" in status:
        os._exit(int(status["exit"]))
    killed_by = int(status["signal"])
    with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
        signal.signal(killed_by, signal.SIG_DFL)
    os.kill(os.getpid(), killed_by)
    os._exit(128 + signum)


# --- the zygote's side ----------------------------------------------------------------------------

def preload(modules: list[str]) -> None:
    """What every rank imports before its first line of work, and `modules` (the entry point's, named
    by whoever starts the zygote). pyarrow stays out: its allocator starts threads, and forking a
    process with threads is not safe."""
    import importlib

    import accelerate  # noqa: F401
    import diffusers
    import numpy  # noqa: F401
    import PIL.Image  # noqa: F401
    import torch.distributed  # noqa: F401
    import transformers

    for module in modules:
        importlib.import_module(module)
    for name in ("FluxPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline", "FluxKontextPipeline",
                 "WanPipeline", "WanImageToVideoPipeline", "AutoencoderKL", "AutoencoderKLWan",
                 "FluxTransformer2DModel", "WanTransformer3DModel", "FlowMatchEulerDiscreteScheduler"):
        getattr(diffusers, name)
    for name in ("CLIPTextModel", "CLIPTokenizer", "T5EncoderModel", "T5TokenizerFast", "UMT5EncoderModel",
                 "AutoTokenizer", "CLIPVisionModel", "CLIPImageProcessor"):
        getattr(transformers, name)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Imports out of the cyclic collector's way: by the zygote, a rank that starts the ordinary way, the agent.

    Torch, diffusers and transformers make ~0.57 M objects that live as long as the process: a collector running
    meanwhile only walks them, again and again (preloading took 4.1 s instead of 5.0 s without it, measured).
    Once made, they are frozen: the process's collections would otherwise walk them too (and, in a forked rank,
    copy them page by page; measured, a compiled job's rank loaded its pipeline in 0.45 s instead of 0.15 s)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def preload_unwatched(modules: list[str]) -> None:
    with collector_paused():
        preload(modules)


def _run_child(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: become the rank that asked, run it, return its exit code."""
    for target, fd in zip((0, 1, 2), fds[:3], strict=True):
        os.dup2(fd, target)
    alive = fds[3]
    for fd in fds[:3]:
        if fd > 2:
            os.close(fd)

    def watch() -> None:
        while os.read(alive, 1):
            pass
        os.kill(os.getpid(), signal.SIGKILL)  # the rank's process is gone: so is its child

    threading.Thread(target=watch, name="zygote-watch", daemon=True).start()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.path[:] = request["path"]
    import runpy

    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def serve(path: str, warm: bool = True, modules: list[str] | None = None) -> None:
    # Listening before the imports: a rank that comes early waits in the backlog, not starts the ordinary way.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    if warm:
        preload_unwatched(modules or [])
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    parent = os.getppid()
    env = dict(os.environ)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while os.getppid() == parent:  # the test worker is gone: so is its zygote
        watched: list[socket.socket | int] = [listener, wake_r]
        readable, _, _ = select.select(watched, [], [], 1.0)
        if wake_r in readable:
            os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            outcome = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                       else {"exit": os.waitstatus_to_exitcode(status)})
            with contextlib.suppress(OSError):  # the rank's process may be gone already
                _send(conn, outcome)
            conn.close()
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        try:
            request, fds = _receive(conn, max_fds=4)
        except (EOFError, OSError, ValueError):
            conn.close()
            continue
        if differ := import_time_mismatch(env, request["env"]):
            _send(conn, {"refused": f"import-time variables differ: {', '.join(differ)}"})
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                listener.close()
                conn.close()
                for other in children.values():  # the other ranks' connections: theirs to end
                    other.close()
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                    signal.signal(signum, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                os.setsid()
                code = _run_child(request, fds)
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        for fd in fds:
            os.close(fd)
        children[pid] = conn
        _send(conn, {"pid": pid})


def _spawn(env: dict[str, str], args: list[str], stdout: int) -> tuple[subprocess.Popen[Any], str]:
    folder = tempfile.mkdtemp(prefix="muralist-zygote-")  # short: a socket path has ~100 bytes
    path = os.path.join(folder, "socket")
    # A session of its own: a Ctrl-C at the terminal is for `muralist run` to pass on to its agents, whose ranks
    # die with the zygote.
    proc = subprocess.Popen([sys.executable, "-m", __name__, path, *args], stdout=stdout, text=True,
                            env={k: v for k, v in env.items() if k != ZYGOTE_ENV}, start_new_session=True)
    return proc, path


def start(env: dict[str, str], modules: tuple[str, ...] = ("muralist_runtime.main",)) -> tuple[
        subprocess.Popen[Any], str]:
    """A zygote for the ranks of this pod, whose environment will be `env` (its import-time part); returns the
    process and the socket to set as MURALIST_ZYGOTE. It does not wait: the ranks do, when they connect."""
    return _spawn(env, list(modules), subprocess.DEVNULL)


# What the ranks set before their imports (main._quiet_libraries; __main__ for a rank the zygote did not serve), set
# for them when a zygote imports for them: its imports must see what theirs would have.
QUIET_LIBRARIES = {"TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error"}
# What a compiled job's ranks import to load a precompiled function (model/precompiled.py): its inductor code's
# imports, 0.9 s of a rank's 1.3 s load measured, paid once by the zygote instead.
COMPILE_MODULES = ("torch._dynamo.aot_compile", "torch._inductor.compile_fx", "torch._inductor.codecache",
                   "torch._inductor.select_algorithm", "torch._inductor.codegen.memory_planning",
                   "torch._functorch._aot_autograd.aot_autograd_result")


def warm_start(runtime: RuntimeSpec, env: dict[str, str]) -> tuple[subprocess.Popen[Any], str, dict[str, str]] | None:
    """A zygote for this pod's ranks, started before the agent (by the launch entry point, or by `muralist
    run` for its agents): on a CPU pod, unless one is given already (the test session's) or MURALIST_ZYGOTE=off.
    Returns it, its socket and the agent's environment, which is the zygote's: what the ranks will have
    (torchrun sets OMP_NUM_THREADS=1 for several workers when it is not set; the ranks quiet the libraries
    before importing them)."""
    if env.get(ZYGOTE_ENV):
        return None
    par = runtime.spec.parallelism
    if par.gpus_per_node > 0:
        return None
    ranks = {**QUIET_LIBRARIES, **env}
    if par.launcher == "torchrun" and par.resolved_processes_per_node > 1:
        ranks.setdefault("OMP_NUM_THREADS", "1")
    modules = ("muralist_runtime.main", *(COMPILE_MODULES if runtime.spec.generation.compile else ()))
    proc, path = start(ranks, modules)
    return proc, path, {**ranks, ZYGOTE_ENV: path}


def stop(proc: subprocess.Popen[Any], path: str) -> None:
    """End a zygote `start` began (its children, the ranks, are torchrun's to end) and remove its socket."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


@contextlib.contextmanager
def started(env: dict[str, str], warm: bool = True, modules: tuple[str, ...] = ("muralist_runtime.main",),
            timeout: float = 180) -> Iterator[str]:
    """A zygote serving ranks whose environment is `env` (its import-time part), until the
    block ends; yields the socket to set as MURALIST_ZYGOTE. `warm`: import the rank's
    libraries and `modules` first; a cold one imports nothing (for its own tests)."""
    proc, path = _spawn(env, list(modules) if warm else ["--cold"], subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], timeout)[0]
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            raise RuntimeError(f"the zygote did not start within {timeout:g} s (exit {proc.poll()})")
        yield path
    finally:
        stop(proc, path)


if __name__ == "__main__":
    # SOCKET [MODULE ...]: import the rank's libraries and those modules, then serve; SOCKET --cold: import nothing.
    serve(sys.argv[1], warm=sys.argv[2:] != ["--cold"], modules=sys.argv[2:])
