"""Fixtures for the runtime tests: real torchrun on CPU with gloo, one tiny pipeline.

Every spawn costs seconds on a busy 2-core box, so the tiny pipeline is built once per
session and the 1-process reference images are rendered once and shared.
Threads are pinned (OMP_NUM_THREADS=1 in every process), so image bytes can be compared.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from muralist_api import contract
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.world import zygote

from tests.builders import JobBuilder

PROMPTS = ["a red fox", "a lighthouse in a storm", {"text": "a robot in a garden", "seed": 42}]


class RuntimeJobBuilder(JobBuilder):
    """tests/builders.JobBuilder with small runtime defaults; obj() gives the spec only."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts(*PROMPTS).world(nodes=1, gpus=0, processes=1)
        self.generation(steps=2, height=32, width=32, imagesPerPrompt=1, extraArgs={"max_sequence_length": 16})

    def processes(self, n: int, nodes: int = 1) -> RuntimeJobBuilder:
        self.world(nodes=nodes, gpus=0, processes=n)
        return self

    def launcher(self, name: str) -> RuntimeJobBuilder:
        self.set("spec.parallelism.launcher", name)
        return self

    def obj(self) -> dict[str, Any]:  # type: ignore[override]
        return super().obj()["spec"]


def make_job() -> RuntimeJobBuilder:
    return RuntimeJobBuilder()


def runtime_spec_json(job: dict[str, Any], output: Path, model_path: Path | None = None,
                      inputs: Path | None = None, name: str = "t") -> str:
    """The RuntimeSpec JSON the operator (or `muralist run`) would write for the job `name`; `inputs`: where
    spec.inputs.volume is mounted."""
    doc = {"name": name, "spec": job, "outputDir": str(output)}
    if model_path is not None:
        doc["modelPath"] = str(model_path)
    if inputs is not None:
        doc["inputsDir"] = str(inputs)
    return RuntimeSpec.model_validate(doc).model_dump_json(by_alias=True, exclude_none=True)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    output: Path
    termination: dict[str, Any] = field(default_factory=dict)

    def images(self, ext: str = "png") -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted((self.output / "images").glob(f"*.{ext}"))
                if p.stem.count(".") == 0}  # not the gallery's <key>.poster.jpg / .input.jpg

    def pixels(self, key: str, ext: str = "png") -> Any:
        """An output's pixels as int16: an image (H, W, 3), or a video's decoded frames (T, H, W, 3)."""
        import numpy as np
        from muralist_runtime.outputs import media
        from PIL import Image

        path = self.output / "images" / f"{key}.{ext}"
        meta = self.meta(key)
        if meta["kind"] == "video":
            return media.decode_video(path.read_bytes(), ext, fps=meta["fps"]).astype(np.int16)
        return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)

    def meta(self, key: str) -> dict[str, Any]:
        return json.loads((self.output / "images" / f"{key}.json").read_text())

    def manifest(self) -> list[dict[str, Any]]:
        path = self.output / "manifest.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def events(self, kind: str = "completed") -> list[dict[str, Any]]:
        """The progress lines the writing ranks printed (one per item rendered, kept, failed)."""
        lines = [json.loads(line.removeprefix(contract.PROGRESS_LINE_PREFIX)) for line in self.stdout.splitlines()
                 if line.startswith(contract.PROGRESS_LINE_PREFIX)]
        return [e for e in lines if e["event"] == kind]


def without_zygote(env: dict[str, str]) -> dict[str, str]:
    """`env` for a run whose ranks must start the ordinary way (imports and all): no zygote, not even the
    pod's own (world/zygote.py)."""
    return {**env, zygote.ZYGOTE_ENV: zygote.OFF}


def as_a_pod(env: dict[str, str]) -> dict[str, str]:
    """`env` for a run whose ranks start as a pod's do: from the zygote its launch entry point starts (a CPU
    pod's), not the test session's."""
    return {k: v for k, v in env.items() if k != zygote.ZYGOTE_ENV}


@pytest.fixture(scope="session")
def runtime_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment for spawned processes: the session's tiny-model cache, pinned threads, no
    hub (tests that use the hub stand-in turn HF_HUB_OFFLINE off), and the session's zygote
    (muralist_runtime/world/zygote.py), from which the ranks fork with their imports done.
    MURALIST_ZYGOTE=off starts every rank the ordinary way."""
    cache = tmp_path_factory.mktemp("muralist-cache")
    env = {
        **os.environ,
        contract.MURALIST_TINY_MODELS: str(cache),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "DIFFUSERS_VERBOSITY": "error",
    }
    if env.pop(zygote.ZYGOTE_ENV, None) == zygote.OFF:
        yield without_zygote(env)
        return
    with zygote.started(env) as socket_path:
        yield {**env, zygote.ZYGOTE_ENV: socket_path}


def build_tiny_in_cache(name: str, runtime_env: dict[str, str]) -> Path:
    """Build a tiny model once, where `name` resolves in spawned processes (MURALIST_TINY_MODELS)."""
    from muralist_runtime.model.resolve import tiny_cache_dir
    from muralist_runtime.model.tiny import build_tiny

    old = os.environ.get(contract.MURALIST_TINY_MODELS)
    os.environ[contract.MURALIST_TINY_MODELS] = runtime_env[contract.MURALIST_TINY_MODELS]
    try:
        return build_tiny(name, tiny_cache_dir(name))
    finally:
        if old is None:
            os.environ.pop(contract.MURALIST_TINY_MODELS)
        else:
            os.environ[contract.MURALIST_TINY_MODELS] = old


@pytest.fixture(scope="session")
def tiny_model(runtime_env: dict[str, str]) -> Path:
    """The tiny Flux, where `muralist/tiny-flux` resolves in spawned processes."""
    return build_tiny_in_cache("muralist/tiny-flux", runtime_env)


@pytest.fixture(scope="session")
def tiny_wan(runtime_env: dict[str, str]) -> Path:
    """The tiny Wan text-to-video pipeline, where `muralist/tiny-wan` resolves."""
    return build_tiny_in_cache("muralist/tiny-wan", runtime_env)


@pytest.fixture(scope="session")
def tiny_wan_i2v(runtime_env: dict[str, str]) -> Path:
    """The tiny Wan image-to-video pipeline, where `muralist/tiny-wan-i2v` resolves."""
    return build_tiny_in_cache("muralist/tiny-wan-i2v", runtime_env)


@pytest.fixture(scope="session")
def tiny_lora(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A random LoRA for the tiny Flux (a folder with pytorch_lora_weights.safetensors)."""
    from muralist_runtime.model.tiny import build_tiny_lora

    return build_tiny_lora(tiny_model, tmp_path_factory.mktemp("lora") / "tiny-lora")


@pytest.fixture(scope="session")
def inputs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An inputs volume: photos of other sizes than the jobs', and an inpainting mask."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("inputs")
    (root / "photos").mkdir()
    noise = np.random.default_rng(0).integers(0, 256, (48, 40, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / "photos" / "noise.png")
    Image.new("RGB", (64, 64), (200, 40, 40)).save(root / "photos" / "red.jpg", quality=95)
    mask = Image.new("L", (40, 48), 0)
    mask.paste(255, (8, 8, 32, 40))  # white = repaint
    mask.save(root / "photos" / "mask.png")
    (root / "photos" / "broken.png").write_bytes(b"not an image")
    return root


def render_in_process(job: dict[str, Any], model: Path, inputs: Path | None = None) -> dict[str, Any]:
    """The job's outputs rendered by the runtime's own functions in this process, one thread,
    no torchrun: {key: layouts.RenderedOutput or the reason it failed}. What 'one process' renders."""
    import torch
    from muralist_runtime.model import call, features, loading
    from muralist_runtime.work import rows

    torch.set_num_threads(1)  # like every spawned rank (OMP_NUM_THREADS=1)
    runtime = RuntimeSpec.model_validate({"name": "t", "spec": job, "outputDir": "/unused",
                                          "inputsDir": str(inputs) if inputs else None})
    pipe = loading.load_pipeline(runtime, str(model), None)
    features.apply_features(pipe, runtime)
    source = rows.open_rows(runtime)
    items = rows.items_of(source.rows(0, source.count()), runtime.spec.generation)
    out = {}
    for item in items:
        output, reason = call.render_checked(pipe, runtime, [item])[0]
        out[item.key] = output if output is not None else reason
    return out


def _termination(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def torchrun(
    spec_json: str,
    output: Path,
    env: dict[str, str],
    nproc: int = 1,
    nnodes: int = 1,
    extra_env: dict[str, str] | None = None,
    timeout: float = 240,
    node_env: list[dict[str, str]] | None = None,
) -> Run:
    """Run the runtime as the pods do: one agent per pod of the spec (the pod contract's launch
    entry point, which starts torchrun), on this machine. `nproc` and `nnodes` must match it;
    `node_env`: more environment for each pod (e.g. its own HF_HOME)."""
    from muralist_runtime import local

    runtime = RuntimeSpec.model_validate_json(spec_json)
    par = runtime.spec.parallelism
    assert (par.resolved_processes_per_node, par.nodes) == (nproc, nnodes), "the spec decides the layout"
    output.mkdir(parents=True, exist_ok=True)
    spec_file = output.parent / f"{output.name}.spec.json"
    spec_file.write_text(spec_json)
    term = output.parent / f"{output.name}.termination"
    term.unlink(missing_ok=True)  # a fresh one per run, as the kubelet gives each container
    procs = []
    for node, (argv, agent_env) in enumerate(local.agent_commands(runtime, str(spec_file),
                                                                   *local.local_ports(nnodes))):
        penv = {**env, **(extra_env or {}), **(node_env[node] if node_env else {}), **agent_env,
                contract.MURALIST_TERMINATION_LOG: str(term),
                contract.MURALIST_PROGRESS_DIR: str(output.parent / f"{output.name}.progress-{node}")}
        procs.append(subprocess.Popen(argv, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=timeout) for p in procs]
    code = next((p.returncode for p in procs if p.returncode), 0)
    return Run(code, "".join(o for o, _ in outs), "".join(e for _, e in outs), output, _termination(term))


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory, runtime_env: dict[str, str], tiny_model: Path) -> Run:
    """The base job rendered by one process: what every layout must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "out"
    run = torchrun(runtime_spec_json(make_job().obj(), out), out, runtime_env, nproc=1)
    assert run.returncode == 0, run.stderr[-3000:]
    return run
