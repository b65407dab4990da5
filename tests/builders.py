"""Fluent builders for DiffusionJob manifests in tests: `make_job().context_parallel(ulysses=2).obj()`."""

from __future__ import annotations

import copy
from typing import Any

from muralist_api.job import API_VERSION, KIND, DiffusionJob
from muralist_api.rules.problems import parse_job

# What a job of several pods writes to in tests: a volume every pod mounts. NFS: a PersistentVolumeClaim that
# does not exist would keep the kwok pods Pending (the scheduler waits for it); nothing mounts it there, and
# `muralist run` writes to a local folder whatever the volume.
SHARED_OUTPUT = {"volume": {"nfs": {"server": "nfs.example", "path": "/results"}}}


class JobBuilder:
    def __init__(self, name: str = "cats", namespace: str | None = None):
        self._m: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "spec": {
                "model": {"name": "muralist/tiny-flux", "dtype": "float32"},
                "prompts": ["a dog", {"text": "a cat", "seed": 7}],
                "generation": {"steps": 2, "height": 32, "width": 32},
                "parallelism": {"strategy": "DataParallel", "gpusPerNode": 0},
            },
        }
        if namespace:
            self._m["metadata"]["namespace"] = namespace

    def _section(self, name: str) -> dict[str, Any]:
        return self._m["spec"].setdefault(name, {})

    def set(self, path: str, value: Any) -> JobBuilder:
        """Set any field by dotted wire path, e.g. set('spec.generation.stepz', 3)."""
        node = self._m
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        return self

    def drop(self, path: str) -> JobBuilder:
        node = self._m
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node.pop(leaf, None)
        return self

    def prompts(self, *prompts: Any) -> JobBuilder:
        self._m["spec"]["prompts"] = list(prompts)
        return self

    def generation(self, **fields: Any) -> JobBuilder:
        self._section("generation").update(fields)
        return self

    def world(self, nodes: int = 1, gpus: int = 0, processes: int | None = None) -> JobBuilder:
        """The layout. Several pods need an output they all mount (the rule that refuses the default emptyDir):
        a job of several pods without an output gets SHARED_OUTPUT (drop it to test that rule)."""
        par = self._section("parallelism")
        par.update({"nodes": nodes, "gpusPerNode": gpus})
        if processes is not None:
            par["processesPerNode"] = processes
        if nodes > 1 and "output" not in self._m["spec"]:
            self._m["spec"]["output"] = copy.deepcopy(SHARED_OUTPUT)
        return self

    def strategy(self, name: str) -> JobBuilder:
        self._section("parallelism")["strategy"] = name
        return self

    def context_parallel(self, ring: int = 1, ulysses: int = 2, backend: str = "native") -> JobBuilder:
        par = self._section("parallelism")
        par["strategy"] = "ContextParallel"
        par["contextParallel"] = {"ringDegree": ring, "ulyssesDegree": ulysses, "attentionBackend": backend}
        return self

    def tensor_parallel(self, degree: int = 2) -> JobBuilder:
        par = self._section("parallelism")
        par["strategy"] = "TensorParallel"
        par["tensorParallel"] = {"degree": degree}
        return self

    def device_map(self, **fields: Any) -> JobBuilder:
        par = self._section("parallelism")
        par["strategy"] = "DeviceMap"
        par["deviceMap"] = fields
        return self

    def output(self, **fields: Any) -> JobBuilder:
        self._section("output").update(fields)
        return self

    def pod_template(self, **fields: Any) -> JobBuilder:
        self._section("podTemplate").update(fields)
        return self

    def run_policy(self, **fields: Any) -> JobBuilder:
        self._section("runPolicy").update(fields)
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._m)

    def job(self) -> DiffusionJob:
        return parse_job(self.obj())


def make_job(name: str = "cats", namespace: str | None = None) -> JobBuilder:
    return JobBuilder(name, namespace)
