"""Strategy checks that end a run permanently, with a message naming the spec field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from muralist_api.contract import PermanentFailure
from muralist_api.job import ContextParallelSpec, DiffusionJobSpec, Strategy, TensorParallelSpec
from muralist_runtime.model.strategies import REGISTRY, Plan, cpu_device_shim, get_strategy


def spec(**parallelism) -> DiffusionJobSpec:
    # model_construct-free: these layouts are valid at admission except where noted.
    return DiffusionJobSpec.model_validate(
        {"model": {"name": "m"}, "prompts": ["a"],
         "parallelism": {"gpusPerNode": 0, "processesPerNode": 4, **parallelism}})


def pipe(heads: int = 2, cp_plan: bool = True, tp_plan: bool = True, transformer: bool = True):
    cls = type("FakeTransformer", (), {"_cp_plan": {} if cp_plan else None,
                                       "_tp_plan": {} if tp_plan else None})
    t = cls()
    t.config = SimpleNamespace(num_attention_heads=heads)
    return SimpleNamespace(transformer=t if transformer else None)


def test_registry_covers_every_strategy() -> None:
    # Auto is resolved to one of the others before any rank starts (muralist_api/planner/).
    assert set(REGISTRY) == {s.value for s in Strategy if s != Strategy.AUTO}
    with pytest.raises(PermanentFailure, match=r"^spec\.parallelism\.strategy: "):
        get_strategy("Nope")
    with pytest.raises(PermanentFailure, match=r"^spec\.parallelism\.strategy: Auto is planned before"):
        get_strategy("Auto")


CP = {"strategy": "ContextParallel"}


@pytest.mark.parametrize(
    ("par", "the_pipe", "field"),
    [
        ({**CP, "contextParallel": {"ulyssesDegree": 4}}, pipe(heads=2),
         "spec.parallelism.contextParallel.ulyssesDegree"),
        ({**CP, "contextParallel": {"ulyssesDegree": 2}}, pipe(cp_plan=False),
         "spec.parallelism.strategy"),
        ({**CP, "contextParallel": {"ulyssesDegree": 2}}, pipe(transformer=False),
         "spec.parallelism.strategy"),
        ({"strategy": "TensorParallel", "gpusPerNode": 4, "tensorParallel": {"degree": 4}},
         pipe(heads=2), "spec.parallelism.tensorParallel.degree"),
        ({"strategy": "TensorParallel", "gpusPerNode": 4, "tensorParallel": {"degree": 2}},
         pipe(tp_plan=False), "spec.parallelism.strategy"),
    ],
    ids=["heads-not-divisible", "no-cp-plan", "unet", "tp-heads", "no-tp-plan"],
)
def test_model_checks(tmp_path, par, the_pipe, field) -> None:
    s = spec(**par)
    strategy = get_strategy(s.parallelism.strategy)
    plan = strategy.plan(s, str(tmp_path), None, gpu=s.parallelism.gpus_per_node > 0)
    with pytest.raises(PermanentFailure) as err:
        strategy.check_model(the_pipe, plan)
    assert str(err.value).startswith(field + ": ")
    assert "\n" not in str(err.value)


def test_model_checks_pass_for_a_fitting_model(tmp_path) -> None:
    s = spec(**CP, contextParallel={"ulyssesDegree": 2})
    strategy = get_strategy("ContextParallel")
    plan = strategy.plan(s, str(tmp_path), None, gpu=False)
    assert plan == Plan("ContextParallel", group_size=2, ulysses=2, attention_backend="native")
    strategy.check_model(pipe(heads=4), plan)


def unchecked(**parallelism) -> DiffusionJobSpec:
    """Layouts admission refuses: the runtime must refuse them too."""
    base = spec()
    par = base.parallelism.model_copy(update=parallelism)
    return base.model_copy(update={"parallelism": par})


def test_tensor_parallel_refused_without_gpu(tmp_path) -> None:
    s = unchecked(strategy="TensorParallel", tensor_parallel=TensorParallelSpec(degree=2))
    with pytest.raises(PermanentFailure, match=r"^spec.parallelism.gpusPerNode: TensorParallel"):
        get_strategy("TensorParallel").plan(s, str(tmp_path), None, gpu=False)
    assert get_strategy("TensorParallel").plan(s, str(tmp_path), None, gpu=True).group_size == 2


@pytest.mark.parametrize(
    ("backend", "ring", "message"),
    [
        ("native", 2, "needs a backend that returns LSE"),
        ("_native_math", 1, "does not support context parallelism"),
        ("no_such_backend", 1, "unknown attention backend"),
        ("flash", 2, "needs GPUs"),
    ],
)
def test_attention_backend_checks(tmp_path, backend: str, ring: int, message: str) -> None:
    s = unchecked(strategy="ContextParallel", context_parallel=ContextParallelSpec.model_construct(
        ring_degree=ring, ulysses_degree=3 - ring, attention_backend=backend))
    with pytest.raises(PermanentFailure, match=message) as err:
        get_strategy("ContextParallel").plan(s, str(tmp_path), None, gpu=False)
    assert str(err.value).startswith("spec.parallelism.contextParallel.attentionBackend: ")


def test_device_map_plan_carries_the_placement(tmp_path) -> None:
    s = spec(strategy="DeviceMap", gpusPerNode=2, processesPerNode=1, deviceMap={"maxMemory": {"0": "20GiB"}})
    strategy = get_strategy("DeviceMap")
    assert strategy.plan(s, str(tmp_path), None, gpu=True).load_kwargs == {
        "device_map": "balanced", "max_memory": {0: "20GiB"}}
    assert strategy.plan(s, str(tmp_path), None, gpu=False).load_kwargs == {}


def test_read_spec_refuses_what_admission_refuses(tmp_path) -> None:
    import json

    from muralist_runtime.main import read_spec

    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "t", "outputDir": "/o", "spec": {
        "model": {"name": "m"}, "prompts": ["a"],
        "parallelism": {"strategy": "TensorParallel", "gpusPerNode": 0, "processesPerNode": 2,
                        "tensorParallel": {"degree": 2}}}}))
    with pytest.raises(PermanentFailure) as err:
        read_spec(str(path))
    assert err.value.field == "spec.parallelism.gpusPerNode"
    path.write_text("{")
    with pytest.raises(PermanentFailure, match=r"^--spec: "):
        read_spec(str(path))


def test_cpu_shim_only_without_gpu_and_restores() -> None:
    import torch

    count, get = torch.accelerator.device_count, torch._C._get_accelerator
    with cpu_device_shim(gpu=False):
        assert torch.accelerator.device_count() == 1
        assert torch._C._get_accelerator().type == "cpu"
    assert (torch.accelerator.device_count, torch._C._get_accelerator) == (count, get)
    with cpu_device_shim(gpu=True):
        assert torch.accelerator.device_count is count
