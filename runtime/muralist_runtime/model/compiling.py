"""generation.compile: torch.compile of the transformer, on a GPU and on a CPU (inductor's C++ backend: it
needs a C++ compiler, which the runtime image has), one graph per size, and the compile cache.

What is compiled (`scope`): a transformer with many repeated blocks (diffusers' `_repeated_blocks`, at least
REGIONAL_MIN_BLOCKS of them: FLUX.1 has 57) compiles one block of each kind and reuses it for every block
(`compile_repeated_blocks`: regional compilation, tens of seconds instead of minutes for the same steady-state
gain); a small transformer compiles whole, where the code between the blocks is a real share of a step (the
trained tiny Flux, 4 blocks: whole 48.7 -> 29.1 ms an image on one CPU thread, regional 46.7 ms). A whole
transformer in one graph (not a parallel group's, whose collectives may break it) is precompiled
(precompiled.py), with an image VAE's decoder: a warm start loads the functions instead of tracing the forward
again (0.5-0.7 s a rank instead of 3.5 s for the tiny Flux). Shapes are
static (`dynamic=False`): each size the job renders gets a graph of its own, compiled at its first call, and
since every call of a compiled job has the job's batch size (render/batching.py pads short ones), nothing
compiles again mid-job. The first size is compiled before generating, by a warm-up call (compileSeconds);
a later size (rows of another height, width or frame count) at its first call.

Each size is looked up in the compile cache first (compile_cache.py): a hit loads what an earlier rank
compiled; a miss compiles and the first rank to finish writes the entry; a hit that still had to build
something (an entry written by an earlier version, without some kernels) writes the entry again, whole.
What each size cost is counted per rank (`CompileRecord`): seconds, whether the cache had it, graphs
compiled (inductor's FX graph cache's misses, and the call signatures precompiled) and kernels built (C++
kernel binaries: a CPU's, loading an entry's functions included), for the job file.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muralist_api.items import Item, Shape
from muralist_api.runtime_spec import RuntimeSpec

from . import call, compile_cache
from .precompiled import PrecompiledForward

log = logging.getLogger("muralist.compile")

# Fewer repeated blocks than this: the whole transformer compiles (see the module's docstring).
REGIONAL_MIN_BLOCKS = 8
# Graphs dynamo keeps per compiled function before it falls back to eager: one per size of the job.
RECOMPILE_LIMIT = 64
# Of spec.parallelism, what changes the transformer's code (a data-parallel world of any size runs the same).
LAYOUT_FIELDS = ("strategy", "context_parallel", "tensor_parallel", "device_map")
WARM_UP_STEPS = 2  # a step compiles the transformer; the rest of the call is not compiled


def scope(transformer: Any) -> str:
    """"regional" (compile_repeated_blocks) or "whole" (the transformer's forward)."""
    kinds = tuple(getattr(transformer, "_repeated_blocks", None) or ())
    blocks = sum(1 for m in transformer.modules() if type(m).__name__ in kinds) if kinds else 0
    return "regional" if blocks >= REGIONAL_MIN_BLOCKS else "whole"


def graphs_compiled() -> int:
    """Graphs inductor compiled in this process: its FX graph cache's misses (looked up each time: dynamo
    replaces its counters when it resets them)."""
    import torch

    return int(torch._dynamo.utils.counters["inductor"]["fxgraph_cache_miss"])


@dataclass
class SizeRecord:
    """What compiling one size cost this rank."""

    seconds: float = 0.0
    cache_hit: bool = False
    graphs_compiled: int = 0
    kernels_built: int = 0
    functions_loaded: int = 0  # precompiled functions the cache entry gave

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "cacheHit": self.cache_hit, "graphsCompiled": self.graphs_compiled,
                "kernelsBuilt": self.kernels_built, "functionsLoaded": self.functions_loaded}


@dataclass
class CompileRecord:
    """One rank's compiling: what was compiled, and each size's cost (the job file's `compile`, by rank)."""

    scope: str
    precompiled: list[str] = field(default_factory=list)  # what is precompiled: "transformer", "decoder"
    sizes: dict[str, SizeRecord] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.sizes.values())

    @property
    def cache_hit(self) -> bool:
        return bool(self.sizes) and all(s.cache_hit for s in self.sizes.values())

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "precompiled": self.precompiled, "seconds": round(self.seconds, 3),
                "cacheHit": self.cache_hit, "graphsCompiled": sum(s.graphs_compiled for s in self.sizes.values()),
                "kernelsBuilt": sum(s.kernels_built for s in self.sizes.values()),
                "functionsLoaded": sum(s.functions_loaded for s in self.sizes.values()),
                "sizes": {name: s.to_json() for name, s in self.sizes.items()}}


def key_parts(runtime: RuntimeSpec, versions: dict[str, str], model: dict[str, Any], device: dict[str, Any],
              scope: str, fullgraph: bool, precompiled: list[str], cpp_wrapper: bool = False) -> dict[str, Any]:
    """What a compile cache entry is keyed by, but the size (compile_cache.py lists it): the versions, the model,
    the device, the compile options, the call's batch and text length, and what changes the transformer's code.
    Not the number of pods or processes: a resized job finds what it compiled before."""
    spec = runtime.spec
    gen = spec.generation
    return {
        **versions,
        "model": model,
        "dtype": spec.model.dtype,
        "device": device,
        "compile": {"scope": scope, "fullgraph": fullgraph, "dynamic": False, "precompiled": precompiled,
                    "cppWrapper": cpp_wrapper},
        "batch": gen.batch_size,
        "textTokens": gen.extra_args.get("max_sequence_length"),
        "code": {"adapters": [a.model_dump(mode="json") for a in spec.model.adapters],
                 "fuseAdapters": spec.model.fuse_adapters,
                 "cache": gen.cache.model_dump(mode="json") if gen.cache else None,
                 "parallelism": spec.parallelism.model_dump(mode="json", include=set(LAYOUT_FIELDS))},
    }


def precompilable(transformer: Any, runtime: RuntimeSpec, scope: str, fullgraph: bool) -> bool:
    """Whether the transformer is precompiled: compiled whole, in one graph, with nothing that changes between
    calls beside its inputs. A precompiled function keeps only its inputs' guards, so not with a step cache
    (generation.cache: its hooks keep state from step to step) nor with accelerate's hooks (DeviceMap's, which
    move weights at each call); those compile the ordinary way, guarded."""
    if scope != "whole" or not fullgraph or runtime.spec.generation.cache is not None:
        return False
    return not any(hasattr(module, "_hf_hook") for module in transformer.modules())


def image_decoder(pipe: Any, runtime: RuntimeSpec) -> Any:
    """The decoder of an image VAE (AutoencoderKL) that decodes whole latents: a fifth of a tiny Flux item's time
    on a CPU, 5.2 -> 4.1 ms compiled. Not a video VAE's (it decodes frame by frame with caches it mutates) nor a
    tiled decode's (a graph per tile size)."""
    vae = getattr(pipe, "vae", None)
    if type(vae).__name__ != "AutoencoderKL" or runtime.spec.generation.vae_tiling:
        return None
    return getattr(vae, "decoder", None)


class CompiledTransformer:
    """A pipeline whose transformer is compiled, and the sizes compiled so far on this rank."""

    def __init__(self, pipe: Any, runtime: RuntimeSpec, source: str, revision: str | None, gpu: bool,
                 parallel: bool, cache: compile_cache.Location | None):
        self.pipe, self.runtime = pipe, runtime
        self.cache = cache
        self.inductor: Path | None = None  # this process's own inductor folder, from apply() to close()
        transformer = pipe.transformer
        self.record = CompileRecord(scope(transformer))
        self.fullgraph = not parallel  # collectives inside a CP/TP group's blocks may break the graph
        # A transformer compiled whole, in one graph, is precompiled (precompiled.py: a warm start loads it in a
        # fraction of a second), and so is an image VAE's decoder beside it; regions and a parallel group's
        # graphs go through torch.compile and its caches.
        self.precompiled: dict[str, PrecompiledForward] = {}
        # On a CPU the precompiled functions' wrapper is C++, not Python: measured on the tiny Flux (2 ranks, warm
        # cache), 0.4-0.85 s of a 14.5 s job and a cold compile of 57 s, not 74 s (12 kernels, not 58).
        cpp_wrapper = not gpu
        if precompilable(transformer, runtime, self.record.scope, self.fullgraph):
            self.precompiled["transformer"] = PrecompiledForward(transformer, cpp_wrapper=cpp_wrapper)
            if (decoder := image_decoder(pipe, runtime)) is not None:
                self.precompiled["decoder"] = PrecompiledForward(decoder, compile_if_not=False,
                                                                 cpp_wrapper=cpp_wrapper)
        self.record.precompiled = sorted(self.precompiled)
        self._parts = key_parts(runtime, compile_cache.versions(),
                                compile_cache.model_identity(source, revision, transformer),
                                compile_cache.device_kind(gpu), self.record.scope, self.fullgraph,
                                self.record.precompiled, cpp_wrapper=bool(self.precompiled) and cpp_wrapper)

    def apply(self) -> None:
        import torch

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self.inductor = compile_cache.own_inductor_dir()
        transformer = self.pipe.transformer
        if self.precompiled:
            for forward in self.precompiled.values():
                forward.install()
        elif self.record.scope == "regional":
            transformer.compile_repeated_blocks(fullgraph=self.fullgraph, dynamic=False)
        else:
            transformer.compile(fullgraph=self.fullgraph, dynamic=False)

    def close(self) -> None:
        """The inductor folder removed (the compiled code is loaded: a process maps its kernels, not reads them)."""
        if self.inductor is not None:
            shutil.rmtree(self.inductor, ignore_errors=True)
            self.inductor = None

    def entry(self, shape: Shape, location: compile_cache.Location) -> compile_cache.Entry:
        return compile_cache.Entry.at(location, {**self._parts, "shape": list(shape)})

    @contextmanager
    def first_call(self, shape: Shape) -> Iterator[None]:
        """Around a call: the first of its size loads the size's entry before and, when it compiled, writes
        the entry after (nothing for a size compiled already)."""
        name = shape.describe()
        if name in self.record.sizes:
            yield
            return
        kernels_dir = self.inductor
        if kernels_dir is None:
            raise RuntimeError("CompiledTransformer.first_call before apply(), which makes its inductor folder")
        start, misses = time.perf_counter(), self._graphs_compiled()
        entry = self.entry(shape, self.cache) if self.cache is not None else None
        loaded = compile_cache.load(entry, kernels_dir) if entry is not None else None
        before = compile_cache.kernel_files(kernels_dir)
        if loaded is not None:
            self._load_functions(loaded.functions)  # imports their kernels: built here when the entry lacks them
        yield
        built = compile_cache.kernel_files(kernels_dir) - before
        hit = loaded is not None
        size = SizeRecord(time.perf_counter() - start, hit, self._graphs_compiled() - misses,
                          sum(1 for name in built if name.endswith(".so")), len(loaded.functions) if loaded else 0)
        self.record.sizes[name] = size
        functions = {f"{role}-{sig}": data for role, forward in self.precompiled.items()
                     for sig, data in forward.take_fresh().items()}
        if entry is not None and loaded is None:
            if compile_cache.save(entry, kernels_dir, built, functions):
                log.info("compile cache: wrote %s (%s)", entry.path, name)
        elif entry is not None and loaded is not None and (size.kernels_built or size.graphs_compiled):
            self._mend(entry, loaded, kernels_dir, built, functions, size)
        log.info("compiled %s for %s in %.1fs (%s; %d graphs, %d kernels built)", self.record.scope, name,
                 size.seconds, "from the compile cache" if hit else "no compile cache entry",
                 size.graphs_compiled, size.kernels_built)

    def _mend(self, entry: compile_cache.Entry, loaded: compile_cache.Loaded, kernels_dir: Path, built: set[str],
              functions: dict[str, bytes], size: SizeRecord) -> None:
        """An entry that lacked what this rank had to build (kernels, a call signature: one written by an earlier
        version, or in a shared inductor folder) is replaced by a whole one, so that the next pod builds nothing.
        An artifacts entry is left as it is: torch's artifacts are not read back to write them again."""
        mendable = bool(loaded.functions and (built or functions))
        log.warning("compile cache: %s lacked what this rank compiled (%d graphs, %d kernels)%s", entry.path,
                    size.graphs_compiled, size.kernels_built, "; writing a whole one in its place" if mendable else "")
        if mendable and compile_cache.save(entry, kernels_dir, loaded.kernels | built,
                                           {**loaded.functions, **functions}, replace=True):
            log.info("compile cache: wrote %s again, whole", entry.path)

    def _load_functions(self, functions: dict[str, bytes]) -> None:
        """An entry's functions, named `<role>-<signature>`, each to the forward of its role."""
        for role, forward in self.precompiled.items():
            prefix = f"{role}-"
            forward.load({fn.removeprefix(prefix): data for fn, data in functions.items() if fn.startswith(prefix)})

    def _graphs_compiled(self) -> int:
        """Graphs compiled in this process so far: inductor's (graphs_compiled, which precompiling does not count)
        and the signatures precompiled."""
        return graphs_compiled() + sum(forward.compiled for forward in self.precompiled.values())

    def warm_up(self, first: Item) -> None:
        """Compile the first item's size before generating: one call at the job's batch size."""
        gen = self.runtime.spec.generation
        with self.first_call(first.shape(gen)):
            call.render(self.pipe, self.runtime, [first] * gen.batch_size, steps=min(WARM_UP_STEPS, gen.steps))


def compile_pipeline(pipe: Any, runtime: RuntimeSpec, first: Item, source: str, revision: str | None, gpu: bool,
                     parallel: bool, timings: dict[str, float]) -> CompiledTransformer | None:
    """generation.compile: the transformer compiled and warmed up at the first item's size (compileSeconds);
    None for a pipeline without a transformer (nothing to compile)."""
    if getattr(pipe, "transformer", None) is None:
        log.warning("generation.compile: this pipeline has no transformer; nothing compiled")
        return None
    start = time.perf_counter()
    location = compile_cache.cache_location(runtime.spec.model.compile_cache)
    compiled = CompiledTransformer(pipe, runtime, source, revision, gpu, parallel, location)
    try:
        compiled.apply()
        compiled.warm_up(first)
    except BaseException:
        compiled.close()
        raise
    timings["compileSeconds"] = time.perf_counter() - start
    return compiled
