"""The container's entry point: `python -m muralist_runtime.launch --spec FILE`.

It stands between the pod and the real launcher (torchrun, or accelerate launch) for three
reasons the launchers cannot serve themselves:
- a context-parallel group that spans pods needs its own world's node rank and master
  (index % k, and the first pod of its k), which a field reference cannot compute; pods whose
  groups fit inside them get a world of their own and never rendezvous with other pods;
- torchrun replaces a worker's exit code with its own (1), so a permanent failure would look
  retryable to the Job's podFailurePolicy: this exits 78 when the termination message says
  permanent;
- a permanent verdict is one line, printed here once for the pod (field, message, exit code),
  while the agent (agent.py) leaves out the launcher's report of the failed worker that would
  bury it; the ranks only write it (`muralist run` prints it once for all its agents);
- SIGTERM (a resize, preemption, eviction) drains the pod (world/drain.py): torchrun would pass
  it on and kill its workers 30 s later whatever they were doing, so the signal stays here and
  the ranks find the drain file instead; the pod then exits DRAINED_EXIT_CODE;
- the ranks' imports (torch, diffusers, transformers: ~5 s) need not wait for the agent's own
  and its rendezvous: on a CPU pod a zygote (world/zygote.py) starts first and imports them beside
  the agent, and the ranks fork from it (`zygote.warm_start`).

Everything else is the pod contract's (muralist_api/contract/pod.py): PET_* variables already in the
environment win, so a rendered pod and a local agent run exactly the command they show.
Torch-free and quick: it only reads the spec and starts one process (two on a CPU pod: the zygote).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from muralist_api import contract
from muralist_api.contract.env import PodEnv
from muralist_api.runtime_spec import RuntimeSpec, read_runtime_spec

from .report.termination import permanent_verdict_line, termination_text
from .world import drain, zygote


def read_launch_spec(spec_file: str) -> RuntimeSpec:
    """The runtime spec as the launch reads it: fields of a newer operator that this image does not know are left
    to the ranks, which refuse them by name (exit 78); the launch only needs the world's shape."""
    return read_runtime_spec(Path(spec_file).read_text(), refuse_unknown=False)


def agent_command(spec_file: str, env: dict[str, str],
                  runtime: RuntimeSpec | None = None) -> tuple[list[str], dict[str, str]]:
    """The launcher argv and the PET_* environment of this pod's agent (`runtime`: the spec file's, read already)."""
    runtime = runtime or read_launch_spec(spec_file)
    par = runtime.spec.parallelism
    pod = PodEnv.from_environ(env)
    world, rdzv = contract.pod_world(runtime.name, pod.pod_index, par.resolved_processes_per_node, par.gpus_per_node,
                                     par.group_size, port=pod.rendezvous_port or contract.MASTER_PORT,
                                     host=pod.rendezvous_host)
    # What the pod already carries (rendered by the operator, or set by `muralist run`) wins.
    pet = {**contract.torchrun_env(world, rdzv), **{k: v for k, v in env.items() if k.startswith("PET_")}}
    rdzv = contract.Rendezvous(pet[contract.PET_NODE_RANK], pet[contract.PET_MASTER_ADDR],
                               pet[contract.PET_MASTER_PORT])
    argv = contract.launcher_command(par.launcher, world, rdzv, spec_file,
                                     contract.local_program(par.launcher, sys.executable))
    return argv, pet


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="muralist_runtime.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="RuntimeSpec JSON file.")
    args = parser.parse_args(argv)
    runtime = read_launch_spec(args.spec)
    command, pet = agent_command(args.spec, dict(os.environ), runtime)
    drain_file = PodEnv.from_environ().drain_file or os.path.join(
        tempfile.gettempdir(), f"muralist-drain-{os.getpid()}")
    Path(drain_file).unlink(missing_ok=True)
    env = {**os.environ, **pet, contract.MURALIST_LAUNCHED: "1", contract.MURALIST_DRAIN_FILE: drain_file}
    warm = zygote.warm_start(runtime, env)
    try:
        return _launch(command, warm[2] if warm is not None else env, drain_file)
    finally:
        if warm is not None:
            zygote.stop(warm[0], warm[1])


def _launch(command: list[str], env: dict[str, str], drain_file: str) -> int:
    proc = subprocess.Popen(command, env=env)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)  # the launcher passes it on to its workers

    def drain_pod(_signum: int, _frame: object) -> None:
        drain.request(drain_file)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, drain_pod)
    code = proc.wait()
    text = termination_text()
    if code == 0:
        verdict = contract.Termination.parse(text or "")
        if verdict is not None and verdict.reason == "Drained":
            print(f"muralist: drained: {verdict.message}", file=sys.stderr, flush=True)
            return contract.DRAINED_EXIT_CODE
        return code
    if not contract.is_permanent(code, text):
        return code
    line = permanent_verdict_line(text)
    if line is not None and not PodEnv.from_environ().local:
        print(line, file=sys.stderr, flush=True)
    return contract.PERMANENT_FAILURE_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
