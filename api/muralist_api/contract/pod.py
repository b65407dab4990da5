"""The pod contract: how a pod (or a local agent) is started and what it is told.

The torchrun and accelerate command lines, the PET_* and MURALIST_* environment variables,
the paths inside the pod and the torchrun world each pod joins. Render, the local runner, the
runtime's readers, the CEL reserved-name rule and the test harness all take them from here, so
they cannot drift apart.

An operator starts pods of its own release's runtime image and of the release before
(contract/versions.py): a command, variable or path here is added, never renamed, removed or
given another meaning while an image of the release before may still read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from muralist_api.cel import python_rule

# -- torchrun: it reads PET_<FLAG> for each --flag, so a container needs no flags at all -------
PET_NNODES = "PET_NNODES"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
MASTER_PORT = 29500
# The work-claim store (a standalone c10d TCPStore) that the job's first pod hosts.
CLAIMS_PORT = 29400
# The Job controller annotates each pod with its index; the node rank is a field reference to it.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# With backoffLimitPerIndex, how often this index failed before this pod (its retry number).
INDEX_FAILURE_COUNT_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"
# What torchrun exports to each worker (and accelerate, which runs torchrun's agent underneath).
WORKER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
              "MASTER_ADDR", "MASTER_PORT")

# -- Muralist's own variables, read by the runtime ---------------------------------------------
MURALIST_POD_INDEX = "MURALIST_POD_INDEX"  # the pod's completion index (a field reference); an agent's locally
MURALIST_RENDEZVOUS_HOST = "MURALIST_RENDEZVOUS_HOST"  # every world's master host (local runs: 127.0.0.1)
MURALIST_RENDEZVOUS_PORT = "MURALIST_RENDEZVOUS_PORT"  # the first world's port there (local runs)
MURALIST_CLAIMS_ADDR = "MURALIST_CLAIMS_ADDR"  # host:port of the work-claim store
MURALIST_NAMESPACE = "MURALIST_NAMESPACE"  # the job's namespace (a field reference)
MURALIST_POD_NAME = "MURALIST_POD_NAME"  # the pod's name (a field reference), named in progress reports
MURALIST_ATTEMPT = "MURALIST_ATTEMPT"  # this pod's retry of its index (0, 1, ...: the index failure count)
# Pushed progress: where the pod's first local rank posts, with which token and CA.
MURALIST_PROGRESS_URL = "MURALIST_PROGRESS_URL"
MURALIST_PROGRESS_TOKEN = "MURALIST_PROGRESS_TOKEN"  # a file the kubelet rotates (projected token)
MURALIST_PROGRESS_CA = "MURALIST_PROGRESS_CA"  # a file: the CA that signed the operator's certificate
MURALIST_LOCAL = "MURALIST_LOCAL"  # "1" under `muralist run`: a bar for people, no JSON lines
# "1" under the launch entry point, which prints a permanent verdict once: ranks only write it.
MURALIST_LAUNCHED = "MURALIST_LAUNCHED"
# The file whose existence tells a pod's ranks to drain (the launch entry point creates it on SIGTERM).
MURALIST_DRAIN_FILE = "MURALIST_DRAIN_FILE"
MURALIST_PROGRESS_DIR = "MURALIST_PROGRESS_DIR"  # where a pod's ranks keep their counts (report/rank_files.py)
MURALIST_TERMINATION_LOG = "MURALIST_TERMINATION_LOG"  # overrides TERMINATION_LOG (local runs, tests)
# Where built-in tiny models are built (default under HF_HOME). Not hack/env.sh's MURALIST_CACHE, the
# developer's cache of the venv and the test binaries.
MURALIST_TINY_MODELS = "MURALIST_TINY_MODELS"
MURALIST_STAGE_DIR = "MURALIST_STAGE_DIR"  # node-local disk for model.loading.stage
# Where generation.compile's compile cache lives (default under HF_HOME, the model cache's volume).
MURALIST_COMPILE_CACHE = "MURALIST_COMPILE_CACHE"
# The operator's default runtime image (an operator setting, not a pod variable).
MURALIST_RUNTIME_IMAGE = "MURALIST_RUNTIME_IMAGE"
# Failure injection for tests (runtime/muralist_runtime/testing/faults.py says what each does).
MURALIST_TEST_EXIT_AFTER = "MURALIST_TEST_EXIT_AFTER"
MURALIST_TEST_EXIT_RANK = "MURALIST_TEST_EXIT_RANK"
MURALIST_TEST_HANG_AFTER = "MURALIST_TEST_HANG_AFTER"
MURALIST_TEST_HANG_RANK = "MURALIST_TEST_HANG_RANK"
MURALIST_TEST_BREAK_CP = "MURALIST_TEST_BREAK_CP"
MURALIST_TEST_NAN_ROWS = "MURALIST_TEST_NAN_ROWS"
MURALIST_TEST_RAISE_ROWS = "MURALIST_TEST_RAISE_ROWS"
MURALIST_TEST_OOM_ROWS = "MURALIST_TEST_OOM_ROWS"
MURALIST_TEST_STEP_SLEEP = "MURALIST_TEST_STEP_SLEEP"
MURALIST_TEST_SLOW_RANK = "MURALIST_TEST_SLOW_RANK"
MURALIST_TEST_RENDER_REPEAT = "MURALIST_TEST_RENDER_REPEAT"
MURALIST_TEST_STATIC_PLAN = "MURALIST_TEST_STATIC_PLAN"
MURALIST_TEST_KILL_AT_STEP = "MURALIST_TEST_KILL_AT_STEP"
MURALIST_TEST_DEVICE_MEMORY = "MURALIST_TEST_DEVICE_MEMORY"

# A user env var may not shadow the contract: these prefixes and names are refused.
RESERVED_ENV_PREFIXES = ("PET_", "MURALIST_")
RESERVED_ENV_NAMES = frozenset({*WORKER_ENV, "HF_TOKEN"})

# -- paths inside the pod ----------------------------------------------------------------------
SPEC_DIR = "/etc/muralist/spec"
SPEC_KEY = "spec.json"
SPEC_FILE = f"{SPEC_DIR}/{SPEC_KEY}"
PROMPTS_DIR = "/etc/muralist/prompts"
PROMPTS_FILE = "prompts.txt"
OUTPUT_MOUNT = "/output"
# With spec.output.uri: where a pod stages what it streams (a shard, the index, the manifest) before
# uploading it whole; under /tmp, the pod's emptyDir.
OUTPUT_STAGING = "/tmp/muralist-output"
DATASET_MOUNT = "/data"  # spec.dataset.volume, read-only
INPUTS_MOUNT = "/inputs"  # spec.inputs.volume, read-only
# The job's storage credentials Secret, every key a file (a GCS service-account key, an AWS
# credentials file), beside its keys as environment variables: a key such as
# GOOGLE_APPLICATION_CREDENTIALS=<this dir>/key.json points a client at a file of the same Secret.
STORAGE_CREDENTIALS_DIR = "/var/run/secrets/muralist.dev/storage"
HF_HOME = "/var/cache/huggingface"
DEFAULT_STAGE_DIR = "/tmp/muralist-stage"
# Kubernetes reads a container's termination message from this file.
TERMINATION_LOG = "/dev/termination-log"
RUNTIME_MODULE = "muralist_runtime"
# The container's entry point (runtime/muralist_runtime/launch.py): it starts this pod's
# launcher (torchrun or accelerate launch) for its world and exits 78 on a permanent failure.
LAUNCH_MODULE = f"{RUNTIME_MODULE}.launch"


def pod_command(spec_file: str = SPEC_FILE, python: str = "python") -> list[str]:
    """The command of every pod's container (and of a local agent), whatever the launcher and
    the world: the runtime's launch entry point."""
    return [python, "-m", LAUNCH_MODULE, "--spec", spec_file]


@python_rule()
def reserved_env_problem(name: str) -> str | None:
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        return (f"'{name}' is set by Muralist (torchrun contract / HF token); rename or remove it "
                "(use model.tokenSecret for HF_TOKEN)")
    return None


def reserved_env_cel() -> str:
    """The same rule as reserved_env_problem, for the CRD (`self` is the env list)."""
    prefixes = " && ".join(f"!e.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES)
    names = ", ".join(f"'{n}'" for n in sorted(RESERVED_ENV_NAMES))
    return f"self.all(e, {prefixes} && !(e.name in [{names}]))"


@dataclass(frozen=True)
class World:
    """The torchrun world one pod (or one local agent) joins."""

    nodes: int
    processes_per_node: int
    gpus_per_node: int

    @property
    def size(self) -> int:
        return self.nodes * self.processes_per_node


@dataclass(frozen=True)
class Rendezvous:
    """Where this agent's world meets. Values, or `$(VAR)` references the kubelet expands."""

    node_rank: str
    master_addr: str
    master_port: str


# -- failure domains: which pods form one torchrun world ---------------------------------------


def pods_per_world(group_size: int, processes_per_node: int) -> int:
    """A group that fits in a pod is its own world (pods never rendezvous); a context-parallel
    group larger than a pod spans group_size / processesPerNode pods, and only those meet."""
    return 1 if group_size <= processes_per_node else group_size // processes_per_node


def master_host(job: str, index: int) -> str:
    """The DNS name of pod `index` under the job's headless Service."""
    return f"{job}-{index}.{job}"


def pod_world(job: str, index: int, processes_per_node: int, gpus_per_node: int, group_size: int,
              port: int = MASTER_PORT, host: str | None = None) -> tuple[World, Rendezvous]:
    """The torchrun world of pod `index`: the pod alone, or the pods of its spanning group.

    `host` replaces the master's DNS name (local runs: every agent on 127.0.0.1, each world on
    its own port).
    """
    k = pods_per_world(group_size, processes_per_node)
    world = World(k, processes_per_node, gpus_per_node)
    if host is not None:  # every agent on one machine: each world needs a port of its own
        return world, Rendezvous(str(index % k), host, str(port + index // k))
    if k == 1:
        return world, Rendezvous("0", "127.0.0.1", str(port))
    return world, Rendezvous(str(index % k), master_host(job, index // k * k), str(port))


# -- the launcher command ----------------------------------------------------------------------

Launcher = Literal["torchrun", "accelerate"]


def torchrun_env(world: World, rdzv: Rendezvous) -> dict[str, str]:
    """torchrun's whole configuration, as the PET_* variables it reads for its flags."""
    return {
        PET_NNODES: str(world.nodes),
        PET_NPROC_PER_NODE: str(world.processes_per_node),
        PET_NODE_RANK: rdzv.node_rank,
        PET_MASTER_ADDR: rdzv.master_addr,
        PET_MASTER_PORT: rdzv.master_port,
    }


def launcher_command(launcher: Launcher, world: World, rdzv: Rendezvous, spec_file: str,
                     program: list[str] | None = None) -> list[str]:
    """The command of one agent: `torchrun` (configured by torchrun_env) or `accelerate launch`.

    `program` replaces the launcher executable (`[sys.executable, "-m", ...]` for local runs);
    by default the console scripts of the runtime image.
    """
    runtime = ["-m", RUNTIME_MODULE, "--spec", spec_file]
    if launcher == "torchrun":
        return [*(program or ["torchrun"]), *runtime]
    argv = [*(program or ["accelerate", "launch"]),
            "--num_machines", str(world.nodes),
            "--num_processes", str(world.size),
            "--machine_rank", rdzv.node_rank,
            "--main_process_ip", rdzv.master_addr,
            "--main_process_port", rdzv.master_port,
            "--rdzv_backend", "static",
            # Without these accelerate warns about (and guesses) defaults from a config file.
            "--mixed_precision", "no",
            "--dynamo_backend", "no"]
    if world.size > 1:
        # accelerate starts ONE process without --multi_gpu (even with --cpu), and refuses
        # --multi_gpu together with --cpu; on CPU the runtime's PartialState(cpu=True) then
        # sets up gloo for the processes it started.
        argv.append("--multi_gpu")
    elif world.gpus_per_node == 0:
        argv.append("--cpu")
    return [*argv, *runtime]


# Runs a launcher module in its own process and leaves out the launcher's report of a worker
# that failed permanently (runtime/muralist_runtime/agent.py).
AGENT_MODULE = f"{RUNTIME_MODULE}.agent"


def accelerate_program(python: str) -> list[str]:
    return [python, "-m", AGENT_MODULE, "accelerate.commands.launch"]


def torchrun_program(python: str) -> list[str]:
    return [python, "-m", AGENT_MODULE, "torch.distributed.run"]


def local_program(launcher: Launcher, python: str) -> list[str]:
    """The launcher of `launcher` as a module of this interpreter (no console script needed),
    run by the runtime's agent."""
    return accelerate_program(python) if launcher == "accelerate" else torchrun_program(python)
