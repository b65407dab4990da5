"""Precompiled forwards (model/precompiled.py): one function per call signature, compiled once, serialized for the
compile cache and loaded by another module without compiling; a forward torch cannot precompile is left as it is.
A two-layer module stands in for the transformer (one small C++ kernel to build: seconds)."""

from __future__ import annotations

import io
import logging
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from muralist_api.items import Shape
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.model import compile_cache, compiling, precompiled
from muralist_runtime.model.precompiled import PrecompiledForward, call_key, signature

from tests.builders import make_job


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, scale: float = 1.0, return_dict: bool = True) -> torch.Tensor:
        return self.second(torch.nn.functional.gelu(self.first(x))) * scale


class Breaks(TwoLayers):
    def forward(self, x: torch.Tensor, scale: float = 1.0, return_dict: bool = True) -> torch.Tensor:
        torch._dynamo.graph_break()  # no single graph: torch cannot precompile it
        return super().forward(x, scale)


def test_a_call_key_tells_apart_what_a_graph_is_specialised_on() -> None:
    x = torch.zeros(2, 8)
    same = call_key((x,), {"scale": 1.0, "extra": {"a": None}})
    assert same == call_key((torch.ones(2, 8),), {"scale": 1.0, "extra": {"a": None}}), "values of tensors: no"
    for other in [call_key((torch.zeros(3, 8),), {"scale": 1.0, "extra": {"a": None}}),
                  call_key((x.double(),), {"scale": 1.0, "extra": {"a": None}}),
                  call_key((x,), {"scale": 2.0, "extra": {"a": None}}),
                  call_key((x,), {"scale": 1.0, "extra": {"a": 1}}),
                  call_key((x.t().contiguous().t(),), {"scale": 1.0, "extra": {"a": None}})]:  # other strides
        assert other != same
    with torch.inference_mode():
        assert call_key((x,), {"scale": 1.0, "extra": {"a": None}}) != same, "the grad mode is in it"
    assert signature(same) == signature(call_key((x,), {"scale": 1.0, "extra": {"a": None}}))


def twin(module: TwoLayers) -> TwoLayers:
    """Another module with the same weights and its own, uncompiled forward."""
    other = TwoLayers().eval()
    other.load_state_dict(module.state_dict())
    return other


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[TwoLayers, PrecompiledForward, dict[str, bytes]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    # Building the kernel imports setuptools, which puts its vendored packages on sys.path: a later test of this
    # worker reading the installed versions (tests/unit/test_locks.py) would find those.
    mp.setattr(sys, "path", list(sys.path))
    torch.manual_seed(0)
    module = TwoLayers().eval()
    forward = PrecompiledForward(module)
    forward.install()
    with torch.inference_mode():
        module(torch.randn(2, 8), scale=0.5)
        module(torch.randn(2, 8), scale=0.5)  # the same signature: served, not compiled again
        module(torch.randn(3, 8), scale=0.5)  # another: precompiled too (torch once failed to pickle the first)
    saved = forward.take_fresh()
    mp.undo()
    return module, forward, saved


def test_each_signature_compiles_once_and_matches_eager(compiled: tuple[TwoLayers, PrecompiledForward, dict]) -> None:
    module, forward, saved = compiled
    assert forward.compiled == 2 and len(saved) == 2 and forward.fallback is None
    assert forward.take_fresh() == {}, "taken once"
    with torch.inference_mode():
        for x in (torch.randn(2, 8), torch.randn(3, 8)):
            torch.testing.assert_close(module(x, scale=0.5), forward.original(x, scale=0.5))


def test_another_module_loads_the_functions_and_compiles_nothing(
        compiled: tuple[TwoLayers, PrecompiledForward, dict]) -> None:
    module, _, saved = compiled
    other = twin(module)
    forward = PrecompiledForward(other)
    forward.install()
    forward.load(saved)
    with torch.inference_mode():
        x = torch.randn(2, 8)
        torch.testing.assert_close(other(x, scale=0.5), module(x, scale=0.5))
        with torch.no_grad():
            other.second.weight.mul_(2)  # the weights are the graph's inputs, read at each call
        torch.testing.assert_close(other(x, scale=0.5), forward.original(x, scale=0.5))
    assert forward.compiled == 0 and forward.take_fresh() == {}


def test_guards_are_checked_at_a_call_keys_first_call_only(
        compiled: tuple[TwoLayers, PrecompiledForward, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.aot_compile import AOTCompiledFunction

    checked = []
    guard_check = AOTCompiledFunction.guard_check
    monkeypatch.setattr(AOTCompiledFunction, "guard_check",
                        lambda self, *a, **kw: checked.append(1) or guard_check(self, *a, **kw))
    other = twin(compiled[0])
    forward = PrecompiledForward(other)
    forward.install()
    forward.load(compiled[2])
    with torch.inference_mode():
        x = torch.randn(2, 8)
        for _ in range(3):
            torch.testing.assert_close(other(x, scale=0.5), forward.original(x, scale=0.5))
    assert len(checked) == 1, "checked once, at the key's first call"


def test_compiling_again_starts_from_the_modules_own_forward(
        compiled: tuple[TwoLayers, PrecompiledForward, dict]) -> None:
    module, first, _ = compiled
    assert PrecompiledForward(module).original == first.original == TwoLayers.forward.__get__(module)


def test_a_call_its_guards_refuse_runs_uncompiled_with_a_warning(
        compiled: tuple[TwoLayers, PrecompiledForward, dict], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The safety net under call_key: were it to miss a difference a kept guard checks (here: a tensor made outside
    inference_mode, whose dispatch keys differ), the call runs as it is instead of failing the item."""
    forward = PrecompiledForward(twin(compiled[0]))
    forward.load(compiled[2])
    with torch.inference_mode():
        served = precompiled.call_key((torch.randn(2, 8),), {"scale": 0.5})
    monkeypatch.setattr(precompiled, "call_key", lambda args, kwargs: served)
    x = torch.randn(2, 8)
    with caplog.at_level(logging.WARNING, "muralist.compile"), torch.inference_mode():
        torch.testing.assert_close(forward(x, scale=0.5), forward.original(x, scale=0.5))
        torch.testing.assert_close(forward(x, scale=0.5), forward.original(x, scale=0.5))
    assert forward.compiled == 0
    assert len([r for r in caplog.records if "guard refused" in r.getMessage()]) == 1, "said once"


def test_a_forward_torch_cannot_precompile_is_left_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    module = Breaks().eval()
    forward = PrecompiledForward(module, compile_if_not=False)
    forward.install()
    x = torch.randn(2, 8)
    y = torch.randn(3, 8)
    with caplog.at_level(logging.WARNING, "muralist.compile"), torch.inference_mode():
        outputs = module(x), module(y)  # a second signature: not tried again
        torch.testing.assert_close(outputs, (forward.original(x), forward.original(y)))
    assert forward.compiled == 0 and forward.take_fresh() == {}
    warned = [r.getMessage() for r in caplog.records if "cannot precompile Breaks" in r.getMessage()]
    assert len(warned) == 1 and "left uncompiled" in warned[0], warned


def pod(module: TwoLayers, cache: Path) -> tuple[compiling.CompiledTransformer, compiling.SizeRecord, Path]:
    """A new pod compiling `module` (compiling.py's own path, the first call of a size) with `cache`: what its
    record says, and the inductor folder it compiled in (removed by close)."""
    job = make_job().generation(compile=True).job()
    compiled = compiling.CompiledTransformer(SimpleNamespace(transformer=module), RuntimeSpec(name="j", spec=job.spec,
                                             output_dir="/out"), "tiny", None, False, False,
                                             compile_cache.Location(str(cache)))
    compiled.apply()
    folder = compiled.inductor
    assert folder is not None and compile_cache.kernel_files(folder) == set(), "an empty folder of its own"
    with compiled.first_call(Shape(64, 64)), torch.inference_mode():
        module(torch.randn(2, 8), scale=0.5)
    compiled.close()
    assert not folder.exists()
    return compiled, compiled.record.sizes["64x64"], folder


def entry_members(cache: Path) -> list[str]:
    [entry] = cache.glob("*.tar")
    with tarfile.open(entry) as tar:
        return sorted(tar.getnames())


def test_each_pod_compiles_in_its_own_folder_and_an_entry_that_lacks_kernels_is_counted_and_mended(
        compiled: tuple[TwoLayers, PrecompiledForward, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module fixture built this module's kernel in TORCHINDUCTOR_CACHE_DIR: a pod that compiled there (a
    pod's ranks share /tmp) used it without building it, wrote an entry without it, and every pod after built it
    again while its record said it built nothing."""
    shared = tmp_path / "shared-inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    monkeypatch.setattr(sys, "path", list(sys.path))  # see the fixture
    cache = tmp_path / "cache"
    _, cold, _ = pod(twin(compiled[0]), cache)
    assert (cold.cache_hit, cold.graphs_compiled) == (False, 1) and cold.kernels_built >= 1, cold
    whole = entry_members(cache)
    kernels = [name for name in whole if name.startswith("kernels/") and name.endswith(".so")]
    assert len(kernels) == cold.kernels_built, whole

    # An entry without its kernels (as one written in a shared folder was): loaded, built again, counted, mended.
    [entry] = cache.glob("*.tar")
    with tarfile.open(entry) as tar:
        kept = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if not m.name.startswith("kernels/")}
    with tarfile.open(entry, "w") as tar:
        for name, data in kept.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _, lacking, _ = pod(twin(compiled[0]), cache)
    assert (lacking.cache_hit, lacking.functions_loaded, lacking.graphs_compiled) == (True, 1, 0), lacking
    assert lacking.kernels_built == cold.kernels_built, "the kernels it built again are counted"
    assert entry_members(cache) == whole, "and the entry is whole again"

    _, warm, _ = pod(twin(compiled[0]), cache)
    assert (warm.cache_hit, warm.functions_loaded, warm.graphs_compiled, warm.kernels_built) == (True, 1, 0, 0)
