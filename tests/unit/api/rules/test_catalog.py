"""The rules catalog agrees with the installed diffusers, and admission and the runtime apply it alike."""

from __future__ import annotations

import inspect
import re

import pytest
from muralist_api.contract import PermanentFailure
from muralist_api.job import ContextParallelSpec
from muralist_api.rules import catalog
from muralist_api.rules.catalog import ATTENTION_BACKENDS, MODEL_LAYOUTS
from muralist_api.rules.problems import ValidationProblem

from tests.builders import make_job

diffusers = pytest.importorskip("diffusers")


@pytest.mark.parametrize("layout", MODEL_LAYOUTS.values(), ids=lambda layout: layout.pipeline)
def test_table_matches_diffusers_plans(layout) -> None:
    transformer = getattr(diffusers, layout.transformer)
    assert hasattr(diffusers, layout.pipeline)
    assert bool(getattr(transformer, "_cp_plan", None)) == layout.context_parallel
    assert bool(getattr(transformer, "_tp_plan", None)) == layout.tensor_parallel


@pytest.mark.parametrize(("model", "pipeline", "strategy"), [
    ("stabilityai/stable-diffusion-xl-base-1.0", None, "cp"),
    ("my-org/private-model", "StableDiffusionPipeline", "cp"),
    ("Wan-AI/whatever", "WanPipeline", "tp"),
])
def test_admission_refuses_layouts_the_model_cannot_run(model: str, pipeline: str | None, strategy: str) -> None:
    builder = make_job().set("spec.model.name", model)
    if pipeline:
        builder.set("spec.model.pipeline", pipeline)
    builder = builder.context_parallel(ulysses=2) if strategy == "cp" else builder.tensor_parallel(degree=2)
    with pytest.raises(ValidationProblem, match=r"spec\.parallelism\.strategy: .* has none in diffusers"):
        builder.world(gpus=2).job()


def test_unknown_models_are_left_to_the_runtime() -> None:
    assert make_job().set("spec.model.name", "my-org/new-model").context_parallel(ulysses=2).world(gpus=2).job()


# -- attention backends ------------------------------------------------------------------------


def _registry():
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    return AttentionBackendName, _AttentionBackendRegistry


def _refuses_lse(backend: str) -> bool:
    """diffusers' own answer: the backend (or the op it runs under context parallelism) raises
    when asked for the log-sum-exp."""
    from diffusers.models import attention_dispatch

    names, registry = _registry()
    sources = [inspect.getsource(registry._backends[names(backend)])]
    if backend == "native":  # its context-parallel path runs this op
        sources.append(inspect.getsource(attention_dispatch._native_attention_forward_op))
    pattern = re.compile(r"if return_lse:\s*\n\s*raise|raise ValueError\([^)]*return_lse", re.MULTILINE)
    return any(pattern.search(src) for src in sources)


def test_backend_table_covers_every_diffusers_backend() -> None:
    names, registry = _registry()
    assert set(ATTENTION_BACKENDS) == {b.value for b in names}
    assert {b.name for b in ATTENTION_BACKENDS.values() if b.context_parallel} == set(
        registry._supports_context_parallel)


@pytest.mark.parametrize("backend", [b.name for b in ATTENTION_BACKENDS.values() if b.context_parallel])
def test_lse_column_matches_diffusers(backend: str) -> None:
    assert ATTENTION_BACKENDS[backend].lse == (not _refuses_lse(backend))


@pytest.mark.parametrize("backend", [b.name for b in ATTENTION_BACKENDS.values() if b.cpu])
def test_cpu_backends_run_on_cpu(backend: str) -> None:
    import torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    q = k = v = torch.randn(1, 8, 2, 16)  # (batch, sequence, heads, head dim)
    out = dispatch_attention_fn(q, k, v, backend=backend)
    assert out.shape == q.shape and torch.isfinite(out).all()


# -- admission and the runtime agree -----------------------------------------------------------

LAYOUTS = [
    # (ring, ulysses, backend, gpus per node)
    (2, 1, "native", 2),
    (2, 1, "_native_math", 2),
    (2, 1, "_native_npu", 2),
    (2, 1, "flash", 2),
    (1, 2, "flash", 0),
    (1, 2, "native", 0),
    (1, 2, "sage", 2),
    (1, 2, "no_such_backend", 2),
    (1, 1, "native", 2),
    (1, 4, "native", 6),
]


@pytest.mark.parametrize(("ring", "ulysses", "backend", "gpus"), LAYOUTS)
def test_admission_and_runtime_reach_the_same_verdict(tmp_path, ring: int, ulysses: int, backend: str,
                                                      gpus: int) -> None:
    from muralist_runtime.model.strategies import get_strategy

    processes = gpus or 2
    builder = make_job().context_parallel(ring=ring, ulysses=ulysses, backend=backend).world(gpus=gpus,
                                                                                           processes=processes)
    try:
        builder.job()
        admitted = None
    except ValidationProblem as e:
        admitted = e.problems[0]
    # The runtime on a machine with the GPUs the spec asks for; a spec admission refused is
    # constructed without validation, as an operator of another version might hand it over.
    spec = make_job().job().spec
    par = spec.parallelism.model_copy(update={
        "strategy": "ContextParallel", "gpus_per_node": gpus, "processes_per_node": processes,
        "context_parallel": ContextParallelSpec.model_construct(ring_degree=ring, ulysses_degree=ulysses,
                                                                attention_backend=backend)})
    spec = spec.model_copy(update={"parallelism": par})
    try:
        get_strategy("ContextParallel").plan(spec, str(tmp_path), None, gpu=gpus > 0)
        refused = None
    except PermanentFailure as e:
        refused = str(e)
    assert admitted == refused


def test_spec_configmap_limit_is_checked_at_admission() -> None:
    prompts = [f"a photo of product number {i} on a white background" for i in range(22_000)]
    with pytest.raises(ValidationProblem) as err:
        make_job().prompts(*prompts).job()
    (problem,) = err.value.problems
    assert problem.startswith("spec.prompts: 22000 inline prompts make a")
    assert "spec.promptsFrom" in problem
    assert catalog.spec_size_problems(100, 1) == []


# -- workloads ---------------------------------------------------------------------------------


def test_scheduler_table_is_diffusers_own() -> None:
    from muralist_api.rules.workloads import SCHEDULERS

    classes = {n for n in dir(diffusers) if n.endswith("Scheduler") and inspect.isclass(getattr(diffusers, n))}
    assert classes == SCHEDULERS


def test_cache_options_are_fields_of_the_diffusers_configs() -> None:
    import dataclasses

    from diffusers import hooks
    from muralist_api.step_cache import CACHES, CacheType

    assert set(CACHES) == set(CacheType.__args__)
    for kind in CACHES.values():
        names = {f.name for f in dataclasses.fields(getattr(hooks, kind.config))}
        assert {field for field, _ in kind.options.values()} <= names, kind.config


def test_video_and_input_pipelines_exist_and_take_what_the_table_says() -> None:
    from muralist_api.rules.workloads import INPUT_PIPELINES, VIDEO_PIPELINES, WITH_INPUTS

    for name, takes in INPUT_PIPELINES.items():
        params = inspect.signature(getattr(diffusers, name).__call__).parameters
        assert "image" in params, name
        assert ("mask_image" in params) == ("mask" in takes), name
    for name in [*VIDEO_PIPELINES, *WITH_INPUTS]:
        assert hasattr(diffusers, name), name
    for name in VIDEO_PIPELINES:
        assert "num_frames" in inspect.signature(getattr(diffusers, name).__call__).parameters, name


@pytest.mark.parametrize(
    ("builder", "field", "words"),
    [
        (lambda b: b.set("spec.model.name", "muralist/tiny-wan").output(format="mp4").generation(numFrames=10,
                                                                                                 height=40),
         "spec.generation.numFrames", "4k+1 frames"),
        (lambda b: b.set("spec.model.name", "muralist/tiny-wan").output(format="mp4").generation(height=40),
         "spec.generation.height", "multiples of 16"),
        (lambda b: b.set("spec.model.name", "muralist/tiny-wan"), "spec.output.format", "renders videos"),
        (lambda b: b.output(format="mp4"), "spec.output.format", "renders images"),
        (lambda b: b.prompts({"text": "a cat", "image": "cat.png"}).set("spec.inputs", {"volume": {"emptyDir": {}}}),
         "spec.prompts", "FluxImg2ImgPipeline"),
        (lambda b: b.set("spec.model.pipeline", "FluxImg2ImgPipeline").prompts({"text": "a", "image": "a.png"}),
         "spec.inputs", "spec.inputs.volume"),
        (lambda b: b.generation(scheduler={"name": "NoSuchScheduler"}), "spec.generation.scheduler.name",
         "no scheduler"),
        (lambda b: b.generation(cache={"type": "FirstBlockCache", "options": {"treshold": 0.1}}),
         "spec.generation.cache.options.treshold", "it takes threshold"),
        (lambda b: b.generation(cache={"type": "FirstBlockCache", "options": {"": None}}),
         'spec.generation.cache.options[""]', "it takes threshold"),
        (lambda b: b.generation(cache={"type": "FirstBlockCache", "options": {"a.b": 1}}),
         'spec.generation.cache.options["a.b"]', "it takes threshold"),
        (lambda b: b.context_parallel(ulysses=2).world(gpus=2).generation(cache={"type": "FirstBlockCache"}),
         "spec.generation.cache.type", "use TaylorSeer"),
        (lambda b: b.tensor_parallel(2).world(gpus=2).set("spec.model.adapters", [{"name": "/lora"}]),
         "spec.model.fuseAdapters", "fuseAdapters: true"),
        (lambda b: b.set("spec.dataset", {"volume": {"emptyDir": {}}, "path": "rows.jsonl"}), "spec.dataset",
         "remove prompts"),
        (lambda b: b.generation(cache={"type": "MagCache", "options": {"ratios": [1.0, "x"]}}),
         "spec.generation.cache.options.ratios", "positive numbers"),
        (lambda b: b.generation(cache={"type": "MagCache", "options": {"ratios": [1.0], "calibrate": True}}),
         "spec.generation.cache.options.calibrate", "remove one"),
    ],
    ids=["wan-frames", "wan-size", "wan-png", "image-mp4", "text-pipeline-image", "inputs-volume",
         "scheduler", "cache-option", "cache-option-empty", "cache-option-dotted", "cache-cp", "tp-lora",
         "dataset-and-prompts", "magcache-ratios", "magcache-calibrate-and-ratios"],
)
def test_workload_rules_name_the_field_and_the_fix(builder, field: str, words: str) -> None:
    with pytest.raises(ValidationProblem) as err:
        builder(make_job()).job()
    assert any(p.startswith(f"{field}: ") and words in p for p in err.value.problems), err.value.problems


def test_workloads_that_fit_are_admitted() -> None:
    wan = make_job().set("spec.model.name", "muralist/tiny-wan").output(format="mp4").generation(
        numFrames=9, height=32, width=32, cache={"type": "TaylorSeer", "options": {"cacheInterval": 3}})
    assert wan.context_parallel(ulysses=2).world(gpus=0, processes=2).job()
    calibrated = make_job().set("spec.model.name", "muralist/tiny-wan").output(format="mp4").generation(
        numFrames=9, height=32, width=32, cache={"type": "MagCache", "options": {"calibrate": True}})
    assert calibrated.job(), "MagCache is not Flux-only: it calibrates on any transformer"
    assert make_job().generation(cache={"type": "MagCache", "options": {"ratios": [1.0, 0.98, 0.95]}}).job()
    gated = make_job().generation(cache={"type": "FirstBlockCache", "verify": {
        "sample": "5%", "minPsnr": 30, "minSsim": 0.9, "onFail": "DisableCache"}}).job()
    verify = gated.spec.generation.cache.verify
    assert verify is not None and verify.on_fail == "DisableCache"
    edit = make_job().set("spec.model.pipeline", "FluxInpaintPipeline").set("spec.inputs", {"volume": {
        "hostPath": {"path": "/photos"}}}).prompts({"text": "a red mug", "image": "mug.png", "mask": "mask.png",
                                                     "strength": 0.8})
    assert edit.generation(scheduler={"name": "FlowMatchEulerDiscreteScheduler", "config": {"shift": 2.0}}).job()
