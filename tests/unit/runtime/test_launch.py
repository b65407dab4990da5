"""The warm start of a pod's ranks (zygote.warm_start, by the launch entry point or `muralist run`): a CPU
pod's ranks fork from a zygote it starts first; a GPU pod's, or a pod given a zygote (the test session's) or
MURALIST_ZYGOTE=off, start as they are."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.world import zygote

from tests.builders import make_job


def runtime_spec(gpus: int, processes: int, compile_: bool = False) -> RuntimeSpec:
    job = make_job().world(nodes=1, gpus=gpus, processes=processes).generation(compile=compile_).job()
    return RuntimeSpec(name="j", spec=job.spec, output_dir="/out")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    envs: list[dict[str, str]] = []

    def start(env: dict[str, str], modules: tuple[str, ...]) -> tuple[Any, str]:
        envs.append({**env, "modules": " ".join(modules)})
        return None, "/tmp/socket"

    monkeypatch.setattr(zygote, "start", start)
    return envs


def test_a_cpu_pod_starts_its_zygote_in_the_environment_its_ranks_will_have(started: list[dict[str, str]]) -> None:
    warm = zygote.warm_start(runtime_spec(0, 2), {"HOME": "/root"})
    assert warm is not None and warm[1] == "/tmp/socket"
    assert started[0]["OMP_NUM_THREADS"] == "1", "torchrun sets it for several workers: the ranks' imports see it"
    assert started[0]["TRANSFORMERS_VERBOSITY"] == "error", "as the ranks set it before importing"
    modules = started[0].pop("modules")
    assert modules == "muralist_runtime.main"
    assert warm[2] == {**started[0], zygote.ZYGOTE_ENV: "/tmp/socket"}, "the agent's: the ranks get the zygote's"
    zygote.warm_start(runtime_spec(0, 1), {"OMP_NUM_THREADS": "2", "DIFFUSERS_VERBOSITY": "info"})
    assert (started[1]["OMP_NUM_THREADS"], started[1]["DIFFUSERS_VERBOSITY"]) == ("2", "info"), "the pod's own win"


@pytest.mark.parametrize(("gpus", "env"), [(1, {}), (0, {zygote.ZYGOTE_ENV: "/the/sessions"}),
                                           (0, {zygote.ZYGOTE_ENV: zygote.OFF})],
                         ids=["gpu-pod", "zygote-given", "off"])
def test_no_zygote_of_its_own(started: list[dict[str, str]], gpus: int, env: dict[str, str]) -> None:
    assert zygote.warm_start(runtime_spec(gpus, 1), env) is None
    assert not started


def test_a_compiled_jobs_zygote_imports_what_loading_a_precompiled_function_needs(
        started: list[dict[str, str]]) -> None:
    zygote.warm_start(runtime_spec(0, 2, compile_=True), {})
    assert started[0]["modules"].split() == ["muralist_runtime.main", *zygote.COMPILE_MODULES]
    # A zygote that cannot import one does not serve: each name must exist in the torch the lock pins.
    assert [m for m in zygote.COMPILE_MODULES if importlib.util.find_spec(m) is None] == []
