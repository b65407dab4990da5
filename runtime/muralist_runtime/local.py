"""`muralist run JOB.yaml`: the same runtime as in the pods, on this machine.

It reads the manifest with the same reader as `muralist validate`, plans a `strategy: Auto` job for
this machine (plan/auto.py: `--gpu-memory`, `--interconnect`, else what the machine shows), writes
the RuntimeSpec the operator would write, and starts one launcher agent per node of the spec with the pod
contract's command and environment (torchrun is configured only through PET_* variables;
several agents rendezvous on 127.0.0.1). A `promptsFrom` ConfigMap in the same file is served
from a local file, as the pods get it mounted. While the agents run, one bar shows the whole
job: the rank files of every agent, summed. Inline prompts' input images are checked before
anything starts. Ctrl-C is forwarded to the agents; SIGTERM drains them as it drains pods (world/drain.py:
each stops claiming, and with runPolicy.checkpoint saves its item in flight where it is), then the run exits
143 and the same command resumes it. The exit code
is the runtime's (78 when permanent, read from the termination message because torchrun
replaces its workers' exit codes), and a permanent verdict is printed once, after the bar.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from muralist_api import contract
from muralist_api.contract.output_folder import GALLERY_ENTRY
from muralist_api.job import DiffusionJob, Strategy
from muralist_api.manifests import ManifestFile, Reader
from muralist_api.planner.device import Interconnect
from muralist_api.planner.table import CannotPlan, plan_job, planned
from muralist_api.rules.problems import ValidationProblem
from muralist_api.runtime_spec import RuntimeSpec, runtime_spec_json
from muralist_api.storage import join_uri

from .model.inputs import missing_inline_inputs
from .report.rank_files import read_counts
from .report.termination import permanent_verdict_line
from .world import zygote

BAR_SECONDS = 0.5
URI = re.compile(r"^[a-z][a-z0-9+.-]*://")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Ports picked for the agents' worlds and the claim store start here, below the kernel's
# ephemeral range (EPHEMERAL_RANGE), where no outgoing connection takes its source port.
LISTEN_PORTS_FROM = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port_range(count: int) -> int:
    """The first of `count` consecutive ports free now (the worlds of the agents), below the
    ephemeral range: a port found free there stays free until the run listens on it, where a port
    of bind(0) could meanwhile become the source port of any process's outgoing connection
    (EADDRINUSE when the store starts: seen once under two test workers)."""
    pick = random.SystemRandom()
    below = _ephemeral_start() - count
    for _ in range(50):
        first = pick.randrange(LISTEN_PORTS_FROM, below) if below > LISTEN_PORTS_FROM else free_port()
        try:
            socks = []
            for port in range(first, first + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def local_ports(nodes: int) -> tuple[int, int]:
    """(the first world's rendezvous port, the claim store's port): consecutive ports picked
    together, so that the store never lands on a port a world needs (one world per pod at most)."""
    first = free_port_range(nodes + 1)
    return first, first + nodes


class _Problems:
    """Collects the manifest reader's reports instead of printing them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        self.lines.extend(line for line in text.splitlines() if line)
        return len(text)


def load_job(path: str) -> tuple[DiffusionJob, ManifestFile]:
    """The one DiffusionJob of a file that `muralist validate` accepts, and the file."""
    problems = _Problems()
    reader = Reader(problems, sys.stdin)  # type: ignore[arg-type]
    found = list(reader.jobs([path]))
    if reader.failed:
        raise ValidationProblem(problems.lines)
    if len(found) != 1:
        names = ", ".join(job.metadata.name for job, _ in found)
        raise ValidationProblem([f"{path}: holds {len(found)} DiffusionJobs ({names}); muralist run takes "
                                 "one: put each in its own file"])
    return found[0]


def prompts_file_for(job: DiffusionJob, manifest: ManifestFile, given: str | None, workdir: Path) -> str | None:
    """The local stand-in for the promptsFrom ConfigMap: --prompts-file, or the ConfigMap in the same file."""
    source = job.spec.prompts_from
    if source is None:
        return None
    if given:
        return str(Path(given).resolve())
    ref = source.config_map_key_ref
    value = manifest.config_map_value(ref.name, ref.key)
    if value is None:
        raise ValidationProblem([
            f"spec.promptsFrom: reads key {ref.key!r} of ConfigMap {ref.name!r}, which is not in {manifest.source}; "
            "add the ConfigMap to the file or pass --prompts-file FILE (one prompt per line)"
        ])
    path = workdir / "prompts.txt"
    path.write_text(value)
    return str(path)


def volume_dir(volume: dict[str, Any] | None, given: str | None, field: str, option: str) -> str | None:
    """The local folder standing in for a read-only volume: the option, or a hostPath's path."""
    if volume is None:
        return None
    if given:
        return str(Path(given).resolve())
    host_path: str | None = (volume.get("hostPath") or {}).get("path")
    if host_path:
        return host_path
    raise ValidationProblem([f"{field}: is not a hostPath, so this machine cannot mount it; pass {option} DIR "
                             "(the folder holding what the volume holds)"])


def output_location(job: DiffusionJob, output: str | None, staging: Path) -> tuple[str, str | None]:
    """(the output folder, the object storage URI it stands for or None): --output DIR or URI, else
    spec.output.uri under its path, else ./muralist-output/<path>. A URI's files are staged in `staging`."""
    uri = output if output and URI.match(output) else None
    if uri is None and output is None and job.spec.output.uri:
        uri = join_uri(job.spec.output.uri, job.output_path)
    if uri is not None:
        return str((staging / "output").resolve()), uri.rstrip("/")
    out = Path(output) if output else Path.cwd() / "muralist-output" / job.output_path
    return str(out.resolve()), None


def runtime_spec(job: DiffusionJob, output: str | None, model: str | None, prompts_file: str | None,
                 dataset_dir: str | None = None, inputs_dir: str | None = None,
                 staging: Path | None = None) -> RuntimeSpec:
    spec = job.spec
    output_dir, output_uri = output_location(job, output, staging or Path(tempfile.gettempdir()))
    dataset, inputs = spec.dataset, spec.inputs
    return RuntimeSpec(
        name=job.metadata.name,
        namespace=job.metadata.namespace or "default",
        spec=spec,
        output_dir=output_dir,
        output_uri=output_uri,
        prompts_file=prompts_file,
        model_path=str(Path(model).resolve()) if model else None,
        dataset_dir=volume_dir(dataset.volume if dataset else None, dataset_dir, "spec.dataset.volume",
                               "--dataset-dir"),
        dataset_uri=join_uri(dataset.uri, dataset.path) if dataset and dataset.uri else None,
        inputs_dir=volume_dir(inputs.volume if inputs else None, inputs_dir, "spec.inputs.volume",
                              "--inputs-dir"),
        inputs_uri=inputs.uri if inputs and inputs.uri else None,
    )


def resolve_auto(runtime: RuntimeSpec, gpu_memory: str | None = None, interconnect: Interconnect | None = None,
                 model: str | None = None) -> RuntimeSpec:
    """A job whose strategy is Auto, planned for this machine as the operator plans for its nodes: the
    runtime spec with the chosen parallelism and the plan (its ranks confirm it); any other job as it is."""
    spec = runtime.spec
    if spec.parallelism.strategy != Strategy.AUTO:
        return runtime
    from .plan.auto import local_device, model_facts

    device = local_device(spec, gpu_memory, interconnect)
    try:
        plan = plan_job(spec, model_facts(spec, model), device)
    except CannotPlan as e:
        raise ValidationProblem([str(e)]) from None
    print(f"muralist: strategy Auto ({plan.objective}): {plan.summary}", file=sys.stderr)
    for reason in plan.reasons:
        print(f"  {reason}", file=sys.stderr)
    return runtime.model_copy(update={"spec": planned(spec, plan), "parallel_plan": plan})


def check_inputs(runtime: RuntimeSpec) -> None:
    """The inline prompts' input images must be there before any weight loads (in pods, a
    missing one fails its item only: the volume may be filled while the job waits)."""
    problems = missing_inline_inputs(runtime)
    if problems:
        raise ValidationProblem(problems)


def agent_commands(runtime: RuntimeSpec, spec_file: str, port: int, claims_port: int) -> list[tuple[list[str],
                                                                                              dict[str, str]]]:
    """One (argv, extra env) per node: each pod's container command, from the pod contract,
    with this machine standing in for the pods' addresses."""
    argv = contract.pod_command(spec_file, python=sys.executable)
    out = []
    for node in range(runtime.spec.parallelism.nodes):
        env = {
            contract.MURALIST_POD_INDEX: str(node),
            contract.MURALIST_RENDEZVOUS_HOST: "127.0.0.1",
            contract.MURALIST_RENDEZVOUS_PORT: str(port),
            contract.MURALIST_CLAIMS_ADDR: f"127.0.0.1:{claims_port}",
        }
        out.append((list(argv), env))
    return out


def verdict(codes: list[int], termination: Path) -> int:
    """The run's exit code: 78 when the runtime said permanent, else the first failure's.
    A permanent verdict is printed here, once for all the agents (they leave it to us)."""
    try:
        message = termination.read_text()
    except OSError:
        message = ""
    if contract.is_permanent(0, message):
        line = permanent_verdict_line(message)
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return contract.PERMANENT_FAILURE_EXIT_CODE
    return next((c for c in codes if c != 0), 0)


class JobBar:
    """One tqdm bar for the whole job: the rank files of every agent, summed, twice a second."""

    def __init__(self, directories: list[Path], total: int | None):
        from tqdm import tqdm

        self.directories = directories
        self.bar = tqdm(total=total, desc="images", unit="img", file=sys.stderr)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="muralist-bar", daemon=True)

    def __enter__(self) -> JobBar:
        self._thread.start()
        return self

    def refresh(self) -> None:
        counts = read_counts(self.directories)
        if counts.total and counts.total != self.bar.total:
            self.bar.total = counts.total
        done = counts.completed + counts.skipped + counts.failed
        if done != self.bar.n:
            self.bar.n = done
            self.bar.refresh()

    def _run(self) -> None:
        while not self._stop.wait(BAR_SECONDS):
            self.refresh()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.refresh()
        self.bar.close()


def _start_agents(runtime: RuntimeSpec, tmp: Path, termination: Path,
                  warm_env: dict[str, str]) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    """One launch entry point per node; `warm_env`: a zygote's environment for its ranks (zygote.warm_start)."""
    spec_file = tmp / "runtime-spec.json"
    spec_file.write_text(runtime_spec_json(runtime))
    base_env = {**os.environ, **warm_env, contract.MURALIST_LOCAL: "1",
                contract.MURALIST_TERMINATION_LOG: str(termination)}
    procs, dirs = [], []
    # Worlds take consecutive ports from the first (one per pod, at most).
    port, claims_port = local_ports(runtime.spec.parallelism.nodes)
    for node, (argv, env) in enumerate(agent_commands(runtime, str(spec_file), port, claims_port)):
        progress = tmp / f"progress-{node}"  # each agent stands for a pod: its own progress directory
        dirs.append(progress)
        # Own sessions: Ctrl-C reaches us only, and we forward it once to each agent, which
        # passes it to its workers and tears the rendezvous down cleanly.
        procs.append(subprocess.Popen(argv, env={**base_env, **env, contract.MURALIST_PROGRESS_DIR: str(progress)},
                                      start_new_session=True))
    return procs, dirs


def _interrupt(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def _drain(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each agent: its launch entry point drains its ranks, as the kubelet's SIGTERM drains a pod."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)


def run_local(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="muralist-run-") as name:
        tmp = Path(name)
        try:
            job, manifest = load_job(args.manifest)
            prompts = prompts_file_for(job, manifest, args.prompts_file, tmp)
            runtime = runtime_spec(job, args.output, args.model, prompts, getattr(args, "dataset_dir", None),
                                   getattr(args, "inputs_dir", None), staging=tmp)
            runtime = resolve_auto(runtime, getattr(args, "gpu_memory", None), getattr(args, "interconnect", None),
                                   args.model)
            check_inputs(runtime)
        except ValidationProblem as e:
            for problem in e.problems:
                print(problem, file=sys.stderr)
            return 1
        # The ranks' imports (~5 s) begin now, in a zygote (world/zygote.py) beside the agents' start, not 0.2 s
        # later in the launch entry point's (which, given this one, starts none).
        warm = zygote.warm_start(runtime, dict(os.environ))
        try:
            return _run_agents(runtime, job.total_images, tmp, warm[2] if warm is not None else {})
        finally:
            if warm is not None:
                zygote.stop(warm[0], warm[1])


def _run_agents(runtime: RuntimeSpec, total_images: int | None, tmp: Path, warm_env: dict[str, str]) -> int:
    Path(runtime.output_dir).mkdir(parents=True, exist_ok=True)
    termination = tmp / "termination-log"
    procs, dirs = _start_agents(runtime, tmp, termination, warm_env)
    before = signal.signal(signal.SIGTERM, lambda _signum, _frame: _drain(procs))
    try:
        with JobBar(dirs, total_images):
            codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        _interrupt(procs)
        print("muralist: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, before)
    code = verdict(codes, termination)
    if code == contract.DRAINED_EXIT_CODE:
        print("muralist: stopped (SIGTERM); run the same command again to resume", file=sys.stderr)
        return code
    if runtime.output_uri is not None:
        print(f"outputs: {runtime.output_uri}")
        return code
    gallery = Path(runtime.output_dir) / GALLERY_ENTRY
    if gallery.exists():
        print(f"gallery: {gallery}")
    return code
