"""The compile cache (model/compile_cache.py) and what its entries are keyed by (model/compiling.py): pure parts
and files on disk, no compile (tests/runtime/test_runtime_compile.py compiles)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from muralist_api.items import Shape
from muralist_api.model import CompileCache
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.model import compile_cache, compiling

from tests.builders import make_job
from tests.s3_plugin import S3Server

VERSIONS = {"torch": "2.15.0", "diffusers": "0.42.1", "python": "3.11.7"}
MODEL = {"source": "/models/flux", "revision": None, "class": "FluxTransformer2DModel", "architecture": "ab12"}
CPU = {"type": "cpu", "machine": "x86_64", "isa": ["avx2", "avx512f"]}
SQUARE = Shape(64, 64)


def runtime(nodes: int = 1, **change: Any) -> RuntimeSpec:
    job = make_job().world(nodes=nodes, processes=2).generation(compile=True, batchSize=2, height=64, width=64)
    for path, value in change.items():
        job.set(path, value)
    return RuntimeSpec(name="j", spec=job.job().spec, output_dir="/out")


def key(rt: RuntimeSpec, shape: Shape = SQUARE, **parts: Any) -> str:
    found = compiling.key_parts(rt, parts.get("versions", VERSIONS), parts.get("model", MODEL),
                                parts.get("device", CPU), parts.get("scope", "whole"), True,
                                parts.get("precompiled", ["decoder", "transformer"]),
                                cpp_wrapper=parts.get("cpp_wrapper", True))
    return compile_cache.Entry.at(compile_cache.Location("/cache"), {**found, "shape": list(shape)}).key


def test_the_same_job_finds_the_same_entry_whatever_its_world() -> None:
    assert key(runtime()) == key(runtime())
    resized = runtime(nodes=4, **{"spec.parallelism.processesPerNode": 1})
    assert key(resized) == key(runtime()), "a resized or re-laid data-parallel job loads what it compiled"


@pytest.mark.parametrize("change", [
    {"spec.model.dtype": "float16"},  # a changed dtype misses
    {"spec.generation.batchSize": 4},
    {"spec.generation.extraArgs": {"max_sequence_length": 77}},
    {"spec.generation.cache": {"type": "FirstBlockCache"}},
])
def test_what_changes_the_compiled_code_misses(change: dict[str, Any]) -> None:
    assert key(runtime(**change)) != key(runtime())


@pytest.mark.parametrize("other", [
    {"versions": {**VERSIONS, "torch": "2.16.0"}},
    {"versions": {**VERSIONS, "diffusers": "0.43.0"}},
    {"model": {**MODEL, "architecture": "cd34"}},
    {"model": {**MODEL, "revision": "0123abc"}},
    {"device": {**CPU, "isa": ["avx2"]}},
    {"device": {"type": "cuda", "name": "NVIDIA H100", "capability": [9, 0], "cuda": "13.2"}},
    {"scope": "regional"},
    {"precompiled": ["transformer"]},  # a decoder no longer precompiled (tiled decoding)
    {"precompiled": []},
    {"cpp_wrapper": False},  # an entry of precompiled functions with Python wrappers (written before, or on a GPU)
])
def test_versions_model_device_and_options_are_in_the_key(other: dict[str, Any]) -> None:
    assert key(runtime(), **other) != key(runtime())


def test_each_size_has_its_own_entry() -> None:
    assert key(runtime(), Shape(64, 96)) != key(runtime(), Shape(64, 64)) != key(runtime(), Shape(64, 64, 17))


def test_an_entry_is_published_once_whole(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "k.tar"
    assert compile_cache.publish(target, b"first")
    assert not compile_cache.publish(target, b"second"), "the second writer leaves the first's entry"
    assert target.read_bytes() == b"first"
    assert [p.name for p in target.parent.iterdir()] == ["k.tar"], "no temp left behind"


def entry_with(tmp_path: Path, members: dict[str, bytes]) -> compile_cache.Entry:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    entry = compile_cache.Entry.at(compile_cache.Location(str(tmp_path)), {"x": 1})
    Path(entry.path).write_bytes(buffer.getvalue())
    return entry


def test_kernels_are_restored_beside_inductors_own_and_never_outside(tmp_path: Path) -> None:
    inductor = tmp_path / "inductor"
    (inductor / "ab").mkdir(parents=True)
    (inductor / "ab" / "built.so").write_bytes(b"mine")
    entry = entry_with(tmp_path, {"kernels/ab/built.so": b"theirs", "kernels/cd/new.so": b"kernel"})
    assert compile_cache.load(entry, inductor)
    assert (inductor / "ab" / "built.so").read_bytes() == b"mine", "a kernel built here already is kept"
    assert (inductor / "cd" / "new.so").read_bytes() == b"kernel"
    assert compile_cache.kernel_files(inductor) == {"ab/built.so", "cd/new.so"}
    (inductor / "fxgraph" / "x").mkdir(parents=True)
    (inductor / "fxgraph" / "x" / "graph").write_bytes(b"g")
    assert "fxgraph/x/graph" not in compile_cache.kernel_files(inductor), "the artifacts restore the graphs"

    outside = entry_with(tmp_path, {"kernels/../../evil.so": b"x"})
    assert not compile_cache.load(outside, inductor)
    assert not (tmp_path / "evil.so").exists()


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """An inductor folder where a rank built one kernel."""
    (tmp_path / "built" / "ab").mkdir(parents=True)
    (tmp_path / "built" / "ab" / "kernel.so").write_bytes(b"kernel")
    return tmp_path / "built"


def test_an_entry_holds_precompiled_functions_and_their_kernels(tmp_path: Path, built: Path) -> None:
    assert_saved_once_and_loaded(compile_cache.Location(str(tmp_path / "cache")), built, tmp_path / "new-pod")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"{compile_cache.entry_key({'x': 3})}.tar"]


def test_an_entry_in_a_bucket_is_written_once_and_loaded_by_a_new_pod(tmp_path: Path, built: Path,
                                                                       s3_server: S3Server) -> None:
    bucket = s3_server.bucket()
    location = compile_cache.cache_location(CompileCache(uri=f"s3://{bucket}/compile", endpoint=s3_server.endpoint))
    assert location == compile_cache.Location(f"s3://{bucket}/compile", s3_server.endpoint)
    assert_saved_once_and_loaded(location, built, tmp_path / "new-pod")
    entry = f"{bucket}/compile/{compile_cache.entry_key({'x': 3})}.tar"
    assert s3_server.filesystem().ls(f"{bucket}/compile") == [entry]
    missing = compile_cache.Entry.at(location, {"x": 4})
    assert compile_cache.load(missing, tmp_path / "inductor") is None, "no entry: a miss"


def assert_saved_once_and_loaded(location: compile_cache.Location, built: Path, inductor: Path) -> None:
    entry = compile_cache.Entry.at(location, {"x": 3})
    functions = {"transformer-0f1e": b"function one", "decoder-2d3c": b"function two"}
    assert compile_cache.save(entry, built, {"ab/kernel.so"}, functions)
    assert not compile_cache.save(entry, built, set(), {"transformer-0f1e": b"another"}), "written once"
    loaded = compile_cache.load(entry, inductor)
    assert loaded is not None and loaded.functions == functions
    assert (inductor / "ab" / "kernel.so").read_bytes() == b"kernel"
    data = compile_cache.read_entry(entry)
    assert data is not None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert compile_cache.ARTIFACTS not in tar.getnames(), "precompiled functions need no torch caches"


def test_no_entry_is_a_miss(tmp_path: Path) -> None:
    assert not compile_cache.load(compile_cache.Entry.at(compile_cache.Location(str(tmp_path)), {"x": 2}),
                                  tmp_path / "inductor")


def test_the_cpu_kind_is_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse4_2 avx avx2 fma avx512f avx512bw\n\nprocessor : 1\n")
    assert compile_cache.cpu_isa(info) == ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw"]
    assert compile_cache.cpu_isa(tmp_path / "absent") == []


def test_the_cache_lives_with_the_model_cache_or_where_the_spec_says() -> None:
    assert compile_cache.cache_location(env={"HF_HOME": "/var/cache/huggingface"}) == compile_cache.Location(
        "/var/cache/huggingface/muralist/compile-cache")
    assert compile_cache.cache_location(env={"HF_HOME": "/x", "MURALIST_COMPILE_CACHE": "/c"}).where == "/c"
    in_bucket = CompileCache(uri="s3://models/compile")
    assert compile_cache.cache_location(in_bucket, {"HF_HOME": "/x"}) == compile_cache.Location("s3://models/compile")
    assert compile_cache.Entry.at(compile_cache.cache_location(in_bucket), {"x": 1}).path.startswith(
        "s3://models/compile/")


class _Blocks:
    def __init__(self, kinds: tuple[str, ...], count: int):
        self._repeated_blocks = kinds
        self._count = count

    def modules(self) -> list[Any]:
        block = type("FluxTransformerBlock", (), {})
        return [self, *(block() for _ in range(self._count))]


@pytest.mark.parametrize(("kinds", "count", "scope"), [
    (("FluxTransformerBlock",), 57, "regional"),  # FLUX.1: one block compiled, reused 57 times
    (("FluxTransformerBlock",), 4, "whole"),  # the tiny Flux: the code between blocks matters
    ((), 0, "whole"),  # no repeated blocks declared
])
def test_regional_where_the_model_repeats_enough_blocks(kinds: tuple[str, ...], count: int, scope: str) -> None:
    assert compiling.scope(_Blocks(kinds, count)) == scope


class _Module:
    def __init__(self, hooked: bool = False):
        if hooked:
            self._hf_hook = object()  # accelerate's, on DeviceMap's modules

    def modules(self) -> list[Any]:
        return [self]


@pytest.mark.parametrize(("module", "change", "scope", "fullgraph", "expected"), [
    (_Module(), {}, "whole", True, True),
    (_Module(), {}, "regional", True, False),  # blocks compile by torch.compile
    (_Module(), {}, "whole", False, False),  # a parallel group's graphs may break
    (_Module(), {"spec.generation.cache": {"type": "FirstBlockCache"}}, "whole", True, False),
    (_Module(hooked=True), {}, "whole", True, False),
], ids=["plain", "regional", "parallel", "step-cache", "device-map-hooks"])
def test_precompiled_only_where_nothing_but_the_inputs_changes_between_calls(
        module: _Module, change: dict[str, Any], scope: str, fullgraph: bool, expected: bool) -> None:
    assert compiling.precompilable(module, runtime(**change), scope, fullgraph) is expected
