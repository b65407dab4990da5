"""generation.compile: torch.compile of the transformer, on a GPU and on a CPU (inductor's C++ backend: it
needs a C++ compiler, which the runtime image has), one graph per size, and the compile cache.

What is compiled (`scope`): a transformer with many repeated blocks (diffusers' `_repeated_blocks`, at least
REGIONAL_MIN_BLOCKS of them: FLUX.1 has 57) compiles one block of each kind and reuses it for every block
(`compile_repeated_blocks`: regional compilation, tens of seconds instead of minutes for the same steady-state
gain); a small transformer compiles whole, where the code between the blocks is a real share of a step (the
trained tiny Flux, 4 blocks: whole 48.7 -> 29.1 ms an image on one CPU thread, regional 46.7 ms). Shapes are
static (`dynamic=False`): each size the job renders gets a graph of its own, compiled at its first call, and
since every call of a compiled job has the job's batch size (render/batching.py pads short ones), nothing
compiles again mid-job. The first size is compiled before generating, by a warm-up call (compileSeconds);
a later size (rows of another height, width or frame count) at its first call.

Each size is looked up in the compile cache first (compile_cache.py): a hit loads what an earlier rank
compiled; a miss compiles and the first rank to finish writes the entry. What each size cost is counted per
rank (`CompileRecord`): seconds, whether the cache had it, graphs inductor compiled (its FX graph cache's
misses) and kernels built (C++ kernel binaries: a CPU's), for the job file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muralist_api.items import Item, Shape
from muralist_api.runtime_spec import RuntimeSpec

from . import call, compile_cache

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

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "cacheHit": self.cache_hit, "graphsCompiled": self.graphs_compiled,
                "kernelsBuilt": self.kernels_built}


@dataclass
class CompileRecord:
    """One rank's compiling: what was compiled, and each size's cost (the job file's `compile`, by rank)."""

    scope: str
    sizes: dict[str, SizeRecord] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.sizes.values())

    @property
    def cache_hit(self) -> bool:
        return bool(self.sizes) and all(s.cache_hit for s in self.sizes.values())

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "seconds": round(self.seconds, 3), "cacheHit": self.cache_hit,
                "graphsCompiled": sum(s.graphs_compiled for s in self.sizes.values()),
                "kernelsBuilt": sum(s.kernels_built for s in self.sizes.values()),
                "sizes": {name: s.to_json() for name, s in self.sizes.items()}}


def key_parts(runtime: RuntimeSpec, versions: dict[str, str], model: dict[str, Any], device: dict[str, Any],
              scope: str, fullgraph: bool) -> dict[str, Any]:
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
        "compile": {"scope": scope, "fullgraph": fullgraph, "dynamic": False},
        "batch": gen.batch_size,
        "textTokens": gen.extra_args.get("max_sequence_length"),
        "code": {"adapters": [a.model_dump(mode="json") for a in spec.model.adapters],
                 "fuseAdapters": spec.model.fuse_adapters,
                 "cache": gen.cache.model_dump(mode="json") if gen.cache else None,
                 "parallelism": spec.parallelism.model_dump(mode="json", include=set(LAYOUT_FIELDS))},
    }


class CompiledTransformer:
    """A pipeline whose transformer is compiled, and the sizes compiled so far on this rank."""

    def __init__(self, pipe: Any, runtime: RuntimeSpec, source: str, revision: str | None, gpu: bool,
                 parallel: bool, cache: Path | None):
        self.pipe, self.runtime = pipe, runtime
        self.cache = cache
        transformer = pipe.transformer
        self.record = CompileRecord(scope(transformer))
        self.fullgraph = not parallel  # collectives inside a CP/TP group's blocks may break the graph
        self._parts = key_parts(runtime, compile_cache.versions(),
                                compile_cache.model_identity(source, revision, transformer),
                                compile_cache.device_kind(gpu), self.record.scope, self.fullgraph)

    def apply(self) -> None:
        import torch

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        transformer = self.pipe.transformer
        if self.record.scope == "regional":
            transformer.compile_repeated_blocks(fullgraph=self.fullgraph, dynamic=False)
        else:
            transformer.compile(fullgraph=self.fullgraph, dynamic=False)

    def entry(self, shape: Shape, directory: Path) -> compile_cache.Entry:
        return compile_cache.Entry.at(directory, {**self._parts, "shape": list(shape)})

    @contextmanager
    def first_call(self, shape: Shape) -> Iterator[None]:
        """Around a call: the first of its size loads the size's entry before and, when it compiled, writes
        the entry after (nothing for a size compiled already)."""
        name = shape.describe()
        if name in self.record.sizes:
            yield
            return
        kernels_dir = compile_cache.inductor_dir()
        start, misses = time.perf_counter(), graphs_compiled()
        entry = self.entry(shape, self.cache) if self.cache is not None else None
        hit = entry is not None and compile_cache.load(entry, kernels_dir)
        before = compile_cache.kernel_files(kernels_dir)
        yield
        built = compile_cache.kernel_files(kernels_dir) - before
        size = SizeRecord(time.perf_counter() - start, hit, graphs_compiled() - misses,
                          sum(1 for name in built if name.endswith(".so")))
        self.record.sizes[name] = size
        if entry is not None and (size.graphs_compiled or not hit) and compile_cache.save(entry, kernels_dir, built):
            log.info("compile cache: wrote %s (%s)", entry.path, name)
        log.info("compiled %s for %s in %.1fs (%s; %d graphs, %d kernels built)", self.record.scope, name,
                 size.seconds, "from the compile cache" if hit else "no compile cache entry",
                 size.graphs_compiled, size.kernels_built)

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
    compiled = CompiledTransformer(pipe, runtime, source, revision, gpu, parallel, compile_cache.cache_dir())
    compiled.apply()
    compiled.warm_up(first)
    timings["compileSeconds"] = time.perf_counter() - start
    return compiled
