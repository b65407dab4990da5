"""The pod's environment, read through one typed view (muralist_api.contract.env.PodEnv)."""

from __future__ import annotations

from muralist_api import contract
from muralist_api.contract.env import HF_TOKEN, PodEnv, TestFaults

from tests.paths import REPO

RUNTIME = REPO / "runtime" / "muralist_runtime"


def test_an_empty_environment_is_a_world_of_one_with_nothing_set() -> None:
    env = PodEnv.from_environ({})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (0, 1, 0, 1)
    assert (env.pod_index, env.attempt, env.pod_name, env.hf_token, env.progress_url) == (0, 0, None, None, None)
    assert not env.local and not env.launched and env.faults == TestFaults()


def test_values_are_parsed_and_empty_ones_are_unset() -> None:
    env = PodEnv.from_environ({
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", contract.MURALIST_POD_INDEX: "2",
        contract.MURALIST_ATTEMPT: "", HF_TOKEN: "", contract.MURALIST_RENDEZVOUS_PORT: "29600",
        contract.MURALIST_LOCAL: "1", contract.MURALIST_TEST_NAN_ROWS: "3, 7", contract.MURALIST_TEST_SLOW_RANK: "0",
    })
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 8), \
        "LOCAL_WORLD_SIZE defaults to the world's size"
    assert (env.pod_index, env.attempt, env.hf_token, env.rendezvous_port, env.local) == (2, 0, None, 29600, True)
    assert env.faults.nan_rows == frozenset({3, 7}) and env.faults.slow_rank == 0


def test_the_runtime_reads_no_contract_variable_but_through_pod_env() -> None:
    names = [n for n in dir(contract) if n.startswith("MURALIST_") and n != "MURALIST_RUNTIME_IMAGE"]
    readers = ("os.environ.get(", "os.getenv(", "environ[")
    offenders = [f"{path.relative_to(RUNTIME)}:{i}" for path in RUNTIME.rglob("*.py")
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if any(r in line for r in readers) and (any(n in line for n in names) or '"HF_' in line)]
    assert offenders == []
