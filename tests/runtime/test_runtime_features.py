"""LoRA adapters, schedulers and step caches on the loaded tiny pipelines, in this process: what
the runtime applies, and the permanent failures naming the field when it cannot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from muralist_api.contract import PermanentFailure
from muralist_api.items import row_items
from muralist_api.options import Adapter, SchedulerSpec
from muralist_api.runtime_spec import RuntimeSpec
from muralist_api.step_cache import CACHES, CacheSpec
from muralist_runtime.model import call, features, loading
from muralist_runtime.step_cache import hooks
from muralist_runtime.step_cache.config import cache_config

from .conftest import make_job


def runtime(job: dict[str, Any]) -> RuntimeSpec:
    return RuntimeSpec.model_validate({"name": "t", "spec": job, "outputDir": "/unused"})


def load(model: Path, job: dict[str, Any] | None = None) -> tuple[Any, RuntimeSpec]:
    spec = runtime(job or make_job().obj())
    return loading.load_pipeline(spec, str(model), None), spec


def pixels(pipe: Any, spec: RuntimeSpec) -> np.ndarray:
    item = row_items(0, "a red fox", spec.spec.generation)[0]
    output, reason = call.render_checked(pipe, spec, [item])[0]
    assert reason is None, reason
    return output.pixels()


def wan_job() -> dict[str, Any]:
    return make_job().obj() | {"model": {"name": "muralist/tiny-wan", "dtype": "float32"}, "output": {"format": "mp4"}}


@pytest.fixture
def flux(tiny_model: Path) -> tuple[Any, RuntimeSpec]:
    return load(tiny_model)


# -- adapters ------------------------------------------------------------------------------------


def test_scale_zero_gives_back_the_base_output_and_fusing_keeps_it(tiny_model: Path, tiny_lora: Path) -> None:
    pipe, spec = load(tiny_model)
    base = pixels(pipe, spec)
    features.load_adapters(pipe, [Adapter(name=str(tiny_lora), scale=1.0)], fuse=False)
    with_lora = pixels(pipe, spec)
    assert np.abs(with_lora - base).max() > 20
    pipe.set_adapters([features.adapter_name(0)], adapter_weights=[0.0])
    assert np.array_equal(pixels(pipe, spec), base)

    fused, _ = load(tiny_model)
    # A file path works as well as its folder; two adapters get two names.
    line = features.load_adapters(fused, [Adapter(name=str(tiny_lora / "pytorch_lora_weights.safetensors"), scale=0.5),
                                          Adapter(name=str(tiny_lora), scale=0.5)], fuse=True)
    assert line.startswith("LoRA adapters fused: ") and fused.get_list_adapters() == {}, "fused, then unloaded"
    assert np.abs(pixels(fused, spec) - with_lora).max() <= 1


def test_an_adapter_that_does_not_fit_fails_permanently_by_name(flux, tiny_lora: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    pipe, _ = flux
    weights = load_file(tiny_lora / "pytorch_lora_weights.safetensors")
    other = tmp_path / "other.safetensors"
    save_file({k.replace(".attn.", ".attn1."): v for k, v in weights.items()}, other, metadata={"format": "pt"})
    with pytest.raises(PermanentFailure) as e:
        features.load_adapters(pipe, [Adapter(name=str(tiny_lora)), Adapter(name=str(other))], fuse=False)
    assert e.value.field == "spec.model.adapters[1]"
    assert str(e.value).startswith(f"spec.model.adapters[1]: LoRA '{other}' does not fit FluxPipeline: "
                                   "NoMatchingPeftModuleError: Target modules")


@pytest.mark.parametrize(("name", "weights", "why"), [
    ("missing", None, "is not a file or a folder in the pod"),
    ("invalid.safetensors", {"foo.bar": [0.0]}, "Invalid LoRA checkpoint"),
])
def test_missing_or_invalid_adapter_files(flux, tmp_path: Path, name: str, weights: Any, why: str) -> None:
    import torch
    from safetensors.torch import save_file

    if weights is not None:
        save_file({k: torch.tensor(v) for k, v in weights.items()}, tmp_path / name)
    with pytest.raises(PermanentFailure, match=why) as e:
        features.load_adapters(flux[0], [Adapter(name=str(tmp_path / name))], fuse=False)
    assert e.value.field == "spec.model.adapters[0]"


# -- scheduler -----------------------------------------------------------------------------------


def test_scheduler_from_the_pipelines_config(flux) -> None:
    pipe, _ = flux
    shift = pipe.scheduler.config.shift
    features.set_scheduler(pipe, SchedulerSpec(name="FlowMatchEulerDiscreteScheduler", config={"shift": 2.0}))
    assert pipe.scheduler.config.shift == 2.0 != shift
    assert pipe.scheduler.config.num_train_timesteps == 1000, "the rest of the config is the pipeline's"


@pytest.mark.parametrize(("name", "config", "field", "why"), [
    ("DPMSolverMultistepScheduler", {"algorithm_type": "bogus"}, "spec.generation.scheduler.config",
     "DPMSolverMultistepScheduler refuses this config: NotImplementedError: bogus is not implemented"),
    ("FlowMatchEulerDiscreteScheduler", {"shfit": 2.0}, "spec.generation.scheduler.config.shfit",
     "FlowMatchEulerDiscreteScheduler takes no 'shfit'; it takes num_train_timesteps, shift"),
    ("DPMSolverMultistepScheduler", {}, "spec.generation.scheduler.name",
     "FluxPipeline passes 'sigmas' to its scheduler and DPMSolverMultistepScheduler's set_timesteps takes none"),
    ("EulerDiscreteScheduler", {}, "spec.generation.scheduler.name",
     "FluxPipeline passes 'mu' to its scheduler"),
])
def test_scheduler_refusals_name_the_field(flux, name: str, config: dict, field: str, why: str) -> None:
    pipe, _ = flux
    before = pipe.scheduler
    with pytest.raises(PermanentFailure) as e:
        features.set_scheduler(pipe, SchedulerSpec(name=name, config=config))
    assert e.value.field == field and why in str(e.value), str(e.value)
    assert pipe.scheduler is before


def test_a_scheduler_check_that_cannot_read_the_pipeline_says_so(caplog: pytest.LogCaptureFixture) -> None:
    # A pipeline whose __call__ has no source to read (built at run time here): the check that
    # the scheduler takes what the call passes is skipped, and the log says so.
    code: dict[str, Any] = {}
    exec("def __call__(self, prompt, sigmas=None):\n    return None", code)  # no source file to read
    pipe = type("OpaquePipeline", (), {"__call__": code["__call__"]})()

    class Scheduler:
        def set_timesteps(self, num_inference_steps: int) -> None: ...

    features._check_timesteps(pipe, Scheduler(), "EulerDiscreteScheduler")
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("spec.generation.scheduler.name: cannot read OpaquePipeline.__call__'s source ("), warning
    assert warning.endswith("not checking that EulerDiscreteScheduler takes the sigmas or mu it may pass")


def test_wan_takes_a_multistep_scheduler(tiny_wan: Path) -> None:
    pipe, _ = load(tiny_wan, wan_job())
    features.set_scheduler(pipe, SchedulerSpec(name="UniPCMultistepScheduler",
                                               config={"prediction_type": "flow_prediction", "use_flow_sigmas": True,
                                                       "flow_shift": 3.0}))
    assert type(pipe.scheduler).__name__ == "UniPCMultistepScheduler"


# -- step caches ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "cache_options"), [
    ("FirstBlockCache", {"threshold": 0.2}),
    ("TaylorSeer", {"cacheInterval": 2, "disableCacheBeforeStep": 1}),
    ("MagCache", {"threshold": 0.1}),
    ("FasterCache", {"spatialAttentionBlockSkipRange": 2}),
    ("PyramidAttentionBroadcast", {"spatialAttentionBlockSkipRange": 2}),
])
def test_every_cache_runs_on_flux_and_renders_the_same_twice(tiny_model: Path, kind: str,
                                                            cache_options: dict) -> None:
    job = make_job().generation(steps=6).obj()
    pipe, spec = load(tiny_model, job)
    hooks.enable_cache(pipe, CacheSpec(type=kind, options=cache_options), steps=6)
    assert type(pipe.transformer._cache_config).__name__ == CACHES[kind].config
    first = pixels(pipe, spec)
    assert np.array_equal(first, pixels(pipe, spec)), "the cache state is reset between calls"


def test_cache_options_reach_the_config(flux) -> None:
    pipe, _ = flux
    config = cache_config(pipe, CacheSpec(type="TaylorSeer", options={"cacheInterval": 3, "maxOrder": 2}), 28)
    assert (config.cache_interval, config.max_order) == (3, 2)
    mag = cache_config(pipe, CacheSpec(type="MagCache"), 8)
    assert mag.num_inference_steps == 8 and len(mag.mag_ratios) == 8, "FLUX_MAG_RATIOS, interpolated to the steps"


def test_magcache_needs_ratios_for_the_model(tiny_wan: Path) -> None:
    pipe, _ = load(tiny_wan, wan_job())
    with pytest.raises(PermanentFailure, match="MagCache needs magnitude ratios calibrated for this model "
                                               r"\(WanTransformer3DModel\).*calibrate: true") as e:
        hooks.enable_cache(pipe, CacheSpec(type="MagCache"), steps=4)
    assert e.value.field == "spec.generation.cache.options"
    given = cache_config(pipe, CacheSpec(type="MagCache", options={"ratios": [1.0, 0.9]}), 4)
    assert given.mag_ratios.tolist() == pytest.approx([1.0, 1.0, 0.9, 0.9]), "given ratios, interpolated to the steps"
    assert cache_config(pipe, CacheSpec(type="MagCache", options={"calibrate": True}), 4).calibrate


@pytest.mark.parametrize(("kind", "works"), [("TaylorSeer", False), ("FirstBlockCache", True),
                                            ("PyramidAttentionBroadcast", True), ("FasterCache", True)])
def test_a_cache_that_would_hook_nothing_is_refused(tiny_wan: Path, kind: str, works: bool) -> None:
    # TaylorSeer's default patterns ('^blocks.*attn', full match) miss Wan's blocks.N.attn1.
    pipe, _ = load(tiny_wan, wan_job())
    if works:
        assert hooks.enable_cache(pipe, CacheSpec(type=kind), steps=4).startswith(f"step cache {kind} on Wan")
        return
    with pytest.raises(PermanentFailure, match=f"{kind} finds no module to cache in WanTransformer3DModel") as e:
        hooks.enable_cache(pipe, CacheSpec(type=kind), steps=4)
    assert e.value.field == "spec.generation.cache.type" and not pipe.transformer.is_cache_enabled


def test_a_transformer_without_cache_hooks_is_refused() -> None:
    class Plain:
        transformer = object()

    with pytest.raises(PermanentFailure) as e:
        hooks.enable_cache(Plain(), CacheSpec(type="TaylorSeer"), steps=4)
    assert e.value.field == "spec.generation.cache" and "object takes no step cache" in str(e.value)
