"""`muralist run JOB.yaml`: the same runtime as in the pods, on this machine.

It validates the manifest, writes the RuntimeSpec the operator would write, and starts one
launcher agent per node of the spec (torchrun, or accelerate launch) with the pods' contract:
torchrun is configured only through PET_* variables, several agents rendezvous on 127.0.0.1.
Ctrl-C is forwarded to the agents; the exit code is the runtime's (78 when permanent, read
from the termination message because torchrun replaces its workers' exit codes).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from .spec import (
    PERMANENT_FAILURE_EXIT_CODE,
    TERMINATION_LOG_ENV,
    DiffusionJob,
    RuntimeSpec,
    ValidationProblem,
    parse_job,
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_job(path: str) -> DiffusionJob:
    try:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise ValidationProblem([f"{path}: {e}"]) from None
    if len(docs) != 1:
        raise ValidationProblem([f"{path}: expected one DiffusionJob, found {len(docs)} documents"])
    return parse_job(docs[0])


def runtime_spec(job: DiffusionJob, output: str | None, model: str | None,
                 prompts_file: str | None) -> RuntimeSpec:
    if job.spec.prompts_from is not None and not prompts_file:
        raise ValidationProblem([
            "spec.promptsFrom: reads a ConfigMap, which a local run has not got; pass "
            "--prompts-file FILE (one prompt per line)"
        ])
    out = Path(output) if output else Path.cwd() / "muralist-output" / job.output_path
    return RuntimeSpec(
        name=job.metadata.name,
        namespace=job.metadata.namespace or "default",
        spec=job.spec,
        output_dir=str(out.resolve()),
        prompts_file=str(Path(prompts_file).resolve()) if prompts_file else None,
        model_path=str(Path(model).resolve()) if model else None,
    )


def agent_commands(runtime: RuntimeSpec, spec_file: str, port: int) -> list[tuple[list[str], dict[str, str]]]:
    """One (argv, extra env) per node: what each pod's container would run."""
    par = runtime.spec.parallelism
    ppn = par.resolved_processes_per_node
    runtime_args = ["-m", "muralist_runtime", "--spec", spec_file]
    out = []
    for node in range(par.nodes):
        if par.launcher == "accelerate":
            argv = [sys.executable, "-m", "accelerate.commands.launch",
                    "--num_processes", str(par.world_size), "--num_machines", str(par.nodes),
                    "--machine_rank", str(node), "--main_process_ip", "127.0.0.1",
                    "--main_process_port", str(port), "--mixed_precision", "no",
                    "--dynamo_backend", "no"]
            if par.world_size > 1:
                # Without --multi_gpu, accelerate starts ONE process on a CPU box, and it
                # refuses --multi_gpu with --cpu; the runtime's PartialState(cpu=True) then
                # sets up gloo for the processes it started.
                argv.append("--multi_gpu")
            elif par.gpus_per_node == 0:
                argv.append("--cpu")
            out.append((argv + runtime_args, {}))
        else:
            env = {
                "PET_NNODES": str(par.nodes),
                "PET_NPROC_PER_NODE": str(ppn),
                "PET_NODE_RANK": str(node),
                "PET_MASTER_ADDR": "127.0.0.1",
                "PET_MASTER_PORT": str(port),
            }
            out.append(([sys.executable, "-m", "torch.distributed.run", *runtime_args], env))
    return out


def _verdict(codes: list[int], termination: Path) -> int:
    try:
        doc = json.loads(termination.read_text())
    except (OSError, ValueError):
        doc = {}
    if doc.get("permanent"):
        return PERMANENT_FAILURE_EXIT_CODE
    return next((c for c in codes if c != 0), 0)


def run_local(args: argparse.Namespace) -> int:
    try:
        job = load_job(args.manifest)
        runtime = runtime_spec(job, args.output, args.model, args.prompts_file)
    except ValidationProblem as e:
        for problem in e.problems:
            print(f"{args.manifest}: {problem}", file=sys.stderr)
        return 1

    Path(runtime.output_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="muralist-run-") as tmp:
        spec_file = Path(tmp) / "runtime-spec.json"
        spec_file.write_text(runtime.model_dump_json(by_alias=True, exclude_none=True))
        termination = Path(tmp) / "termination-log"
        base_env = {**os.environ, "MURALIST_LOCAL": "1", TERMINATION_LOG_ENV: str(termination)}
        port = free_port()
        procs = []
        # Own sessions: Ctrl-C reaches us only, and we forward it once to each agent, which
        # passes it to its workers and tears the rendezvous down cleanly.
        for argv, env in agent_commands(runtime, str(spec_file), port):
            procs.append(subprocess.Popen(argv, env={**base_env, **env}, start_new_session=True))
        try:
            codes = [p.wait() for p in procs]
        except KeyboardInterrupt:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            print("muralist: interrupted; run the same command again to resume", file=sys.stderr)
            return 130
        code = _verdict(codes, termination)
    gallery = Path(runtime.output_dir) / "index.html"
    if gallery.exists():
        print(f"gallery: {gallery}")
    return code
