"""Times every FluxPipeline call of any process that starts with this folder on PYTHONPATH.

runtime_throughput.py puts it there for both of its launchers (`muralist run` and the
accelerate reference), so both sides are timed by the same code: with
MURALIST_BENCH_CALL_LOG=DIR set, each process appends one JSON line per pipeline call to
DIR/calls-<pid>.jsonl: {"start": epoch s, "end": epoch s, "images": n}. Nothing else changes:
the call's arguments, result and signature (functools.wraps) are the pipeline's own, and the
module is patched when it is first imported, not before (no import of diffusers at start).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TARGET = "diffusers.pipelines.flux.pipeline_flux"
LOG_DIR = os.environ.get("MURALIST_BENCH_CALL_LOG")


def _timed(cls: type) -> None:
    call = cls.__call__
    log = os.path.join(LOG_DIR or ".", f"calls-{os.getpid()}.jsonl")

    @functools.wraps(call)
    def timed_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.time()
        out = call(self, *args, **kwargs)
        end = time.time()
        images = getattr(out, "images", None)  # a list of PIL images or an array: no truth value
        with open(log, "a") as f:
            f.write(json.dumps({"start": start, "end": end, "images": 0 if images is None else len(images)}) + "\n")
        return out

    cls.__call__ = timed_call  # type: ignore[method-assign]


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            _timed(module.FluxPipeline)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if LOG_DIR:
    sys.meta_path.insert(0, _PatchOnImport())
