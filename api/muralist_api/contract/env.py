"""The pod's environment as the runtime reads it: one typed view (`PodEnv`) of the contract's variables.

The operator (and `muralist run`) set these variables; the runtime reads them only through
`PodEnv.from_environ`, so each variable is parsed in one place, with one default. It reads
`os.environ` when called, not at import: a launcher may set a variable after the import (the
accelerate launcher's ranks), and tests set them per test.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from muralist_api.contract import (
    MURALIST_ATTEMPT,
    MURALIST_CLAIMS_ADDR,
    MURALIST_COMPILE_CACHE,
    MURALIST_DRAIN_FILE,
    MURALIST_LAUNCHED,
    MURALIST_LOCAL,
    MURALIST_POD_INDEX,
    MURALIST_POD_NAME,
    MURALIST_PROGRESS_CA,
    MURALIST_PROGRESS_DIR,
    MURALIST_PROGRESS_TOKEN,
    MURALIST_PROGRESS_URL,
    MURALIST_RENDEZVOUS_HOST,
    MURALIST_RENDEZVOUS_PORT,
    MURALIST_STAGE_DIR,
    MURALIST_TERMINATION_LOG,
    MURALIST_TEST_BREAK_CP,
    MURALIST_TEST_DEVICE_MEMORY,
    MURALIST_TEST_EXIT_AFTER,
    MURALIST_TEST_EXIT_RANK,
    MURALIST_TEST_HANG_AFTER,
    MURALIST_TEST_HANG_RANK,
    MURALIST_TEST_KILL_AT_STEP,
    MURALIST_TEST_NAN_ROWS,
    MURALIST_TEST_OOM_ROWS,
    MURALIST_TEST_RAISE_ROWS,
    MURALIST_TEST_RENDER_REPEAT,
    MURALIST_TEST_SLOW_RANK,
    MURALIST_TEST_STATIC_PLAN,
    MURALIST_TEST_STEP_SLEEP,
    MURALIST_TINY_MODELS,
)

# The launcher's worker variables (contract.WORKER_ENV) that the runtime reads.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
# The hub's: model.tokenSecret reaches the pod only as HF_TOKEN; HF_HOME is the hub cache's root.
HF_TOKEN = "HF_TOKEN"
HF_HOME_VAR = "HF_HOME"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    return int(value) if value else default


def _rows(env: Mapping[str, str], name: str) -> frozenset[int]:
    return frozenset(int(x) for x in env.get(name, "").split(",") if x.strip())


def _text(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


@dataclass(frozen=True)
class TestFaults:
    """Failure injection for tests (MURALIST_TEST_*; runtime/muralist_runtime/testing/faults.py acts on them)."""

    __test__ = False  # not a pytest class
    exit_after: int = 0
    exit_rank: int = 0
    hang_after: int = 0
    hang_rank: int = 0
    break_cp: bool = False
    nan_rows: frozenset[int] = frozenset()
    raise_rows: frozenset[int] = frozenset()
    oom_rows: frozenset[int] = frozenset()
    step_sleep: float = 0.0
    slow_rank: int = -1
    render_repeat: int = 1
    static_plan: bool = False
    kill_at_step: int = 0
    device_memory: str | None = None  # what a rank measures as its devices' free memory (a size: 64MiB)

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> TestFaults:
        return cls(
            exit_after=_int(env, MURALIST_TEST_EXIT_AFTER, 0),
            exit_rank=_int(env, MURALIST_TEST_EXIT_RANK, 0),
            hang_after=_int(env, MURALIST_TEST_HANG_AFTER, 0),
            hang_rank=_int(env, MURALIST_TEST_HANG_RANK, 0),
            break_cp=env.get(MURALIST_TEST_BREAK_CP) == "1",
            nan_rows=_rows(env, MURALIST_TEST_NAN_ROWS),
            raise_rows=_rows(env, MURALIST_TEST_RAISE_ROWS),
            oom_rows=_rows(env, MURALIST_TEST_OOM_ROWS),
            step_sleep=float(env.get(MURALIST_TEST_STEP_SLEEP) or 0),
            slow_rank=_int(env, MURALIST_TEST_SLOW_RANK, -1),
            render_repeat=_int(env, MURALIST_TEST_RENDER_REPEAT, 1),
            static_plan=env.get(MURALIST_TEST_STATIC_PLAN) == "1",
            kill_at_step=_int(env, MURALIST_TEST_KILL_AT_STEP, 0),
            device_memory=_text(env, MURALIST_TEST_DEVICE_MEMORY),
        )


@dataclass(frozen=True)
class PodEnv:
    """What the pod's environment says, parsed; None where a variable is unset or empty."""

    # The launcher's world (torchrun or accelerate): this process in it.
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    # The pod: its completion index, name and retry; where its first world's master listens.
    pod_index: int = 0
    pod_name: str | None = None
    attempt: int = 0
    rendezvous_host: str | None = None
    rendezvous_port: int | None = None
    claims_addr: str | None = None
    # The operator's progress endpoint and this pod's progress files.
    progress_url: str | None = None
    progress_token: str | None = None
    progress_ca: str | None = None
    progress_dir: str | None = None
    # Files and folders.
    termination_log: str | None = None
    tiny_models_dir: str | None = None  # MURALIST_TINY_MODELS
    stage_dir: str | None = None
    compile_cache_dir: str | None = None  # MURALIST_COMPILE_CACHE
    drain_file: str | None = None
    hf_home: str | None = None
    hf_token: str | None = None
    # How the runtime was started: under `muralist run`, and by the launch entry point.
    local: bool = False
    launched: bool = False
    faults: TestFaults = TestFaults()

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> PodEnv:
        """The view of `env`, by default os.environ as it is now."""
        env = os.environ if env is None else env
        world_size = _int(env, WORLD_SIZE, 1)
        port = env.get(MURALIST_RENDEZVOUS_PORT)
        return cls(
            rank=_int(env, RANK, 0),
            world_size=world_size,
            local_rank=_int(env, LOCAL_RANK, 0),
            local_world_size=_int(env, LOCAL_WORLD_SIZE, world_size),
            pod_index=_int(env, MURALIST_POD_INDEX, 0),
            pod_name=_text(env, MURALIST_POD_NAME),
            attempt=_int(env, MURALIST_ATTEMPT, 0),
            rendezvous_host=_text(env, MURALIST_RENDEZVOUS_HOST),
            rendezvous_port=int(port) if port else None,
            claims_addr=_text(env, MURALIST_CLAIMS_ADDR),
            progress_url=_text(env, MURALIST_PROGRESS_URL),
            progress_token=_text(env, MURALIST_PROGRESS_TOKEN),
            progress_ca=_text(env, MURALIST_PROGRESS_CA),
            progress_dir=_text(env, MURALIST_PROGRESS_DIR),
            termination_log=_text(env, MURALIST_TERMINATION_LOG),
            tiny_models_dir=env.get(MURALIST_TINY_MODELS),
            stage_dir=_text(env, MURALIST_STAGE_DIR),
            compile_cache_dir=_text(env, MURALIST_COMPILE_CACHE),
            drain_file=_text(env, MURALIST_DRAIN_FILE),
            hf_home=_text(env, HF_HOME_VAR),
            hf_token=_text(env, HF_TOKEN),
            local=env.get(MURALIST_LOCAL) == "1",
            launched=env.get(MURALIST_LAUNCHED) == "1",
            faults=TestFaults.from_environ(env),
        )
