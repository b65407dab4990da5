"""A pipeline call resumed from a checkpoint's state renders what the uninterrupted call renders, bit for bit
(runtime/muralist_runtime/model/denoising.py), on each pipeline of the catalog's RESUMABLE_PIPELINES, with a
multistep and a stochastic scheduler; the state goes through the checkpoint file (outputs/checkpoints.py) on its
way. FluxInpaintPipeline is refused: its resume is not exact, as shown here. In this process, one thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from muralist_api.contract import PermanentFailure
from muralist_api.rules.workloads import CHECKPOINT_FIELD, RESUMABLE_PIPELINES
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.model import denoising
from muralist_runtime.model.denoising import DenoisingState, ItemDenoising, StepEnd
from muralist_runtime.outputs import checkpoints

STEPS = 7
SIZE = {"height": 32, "width": 32, "max_sequence_length": 16}


def _load(cls_name: str, root: Path) -> Any:
    import diffusers
    import torch

    torch.set_num_threads(1)  # as every rank runs (OMP_NUM_THREADS=1)
    return getattr(diffusers, cls_name).from_pretrained(root, dtype=torch.float32)


@pytest.fixture(scope="module")
def images() -> dict[str, Any]:
    from PIL import Image

    mask = Image.new("L", (32, 32), 0)
    mask.paste(255, (8, 8, 24, 24))
    return {"image": Image.new("RGB", (32, 32), (200, 40, 40)), "mask": mask}


def call_of(cls_name: str, images: dict[str, Any]) -> dict[str, Any]:
    """The kwargs a job's call would give each pipeline (model/call.py's call_kwargs, for one item)."""
    kwargs: dict[str, Any] = {"prompt": ["a red fox"], "num_inference_steps": STEPS, "output_type": "np", **SIZE}
    if cls_name.startswith("Wan"):
        kwargs["num_frames"] = 9
    if cls_name in ("FluxImg2ImgPipeline", "FluxInpaintPipeline"):
        kwargs.update(image=[images["image"]], strength=0.8)
    if cls_name == "FluxInpaintPipeline":
        kwargs["mask_image"] = [images["mask"]]
    if cls_name == "FluxKontextPipeline":
        kwargs.update(image=[images["image"]], _auto_resize=False, max_area=32 * 32)
    if cls_name == "WanImageToVideoPipeline":
        kwargs["image"] = images["image"]
    return kwargs


def render(pipe: Any, kwargs: dict[str, Any], item: ItemDenoising | None) -> Any:
    """One call as the claim loop makes it: generators seeded by the item, the item's denoising attached."""
    import torch

    kwargs = {**kwargs, "generator": [torch.Generator("cpu").manual_seed(11)]}
    if item is None:
        out = pipe(**kwargs)
    else:
        with denoising.attached(pipe, item):
            denoising.prepare(pipe, kwargs)
            out = pipe(**kwargs)
    return out.frames if hasattr(out, "frames") else out.images


def interrupted_and_resumed(pipe: Any, kwargs: dict[str, Any], at: int, folder: Path) -> tuple[Any, Any, list[int]]:
    """The uninterrupted render (capturing its state after `at` steps, written to a checkpoint file), and the
    render resumed from that file; the steps the resumed call rendered."""
    captured: list[DenoisingState] = []

    def keep(end: StepEnd) -> None:
        if end.step == at:
            captured.append(end.capture())

    whole = render(pipe, kwargs, ItemDenoising(None, keep))
    state = captured[0]
    checkpoints.write(folder, "00000-000", {"requestDigest": "r1:test"}, state.payload())
    found = checkpoints.read(folder, "00000-000")
    assert found is not None and found[0]["requestDigest"] == "r1:test"
    rendered: list[int] = []
    resumed = render(pipe, kwargs, ItemDenoising(DenoisingState.from_payload(found[1]),
                                                 lambda end: rendered.append(end.step)))
    return whole, resumed, rendered


@pytest.fixture(scope="module")
def model_dirs(tiny_model: Path, tiny_wan: Path, tiny_wan_i2v: Path) -> dict[str, Path]:
    return {"Flux": tiny_model, "Wan": tiny_wan, "WanImageToVideo": tiny_wan_i2v}


def model_dir(cls_name: str, dirs: dict[str, Path]) -> Path:
    if cls_name == "WanImageToVideoPipeline":
        return dirs["WanImageToVideo"]
    return dirs["Wan"] if cls_name.startswith("Wan") else dirs["Flux"]


@pytest.mark.parametrize("cls_name", sorted(RESUMABLE_PIPELINES))
def test_each_resumable_pipeline_resumes_bit_for_bit(cls_name: str, model_dirs: dict[str, Path], images: dict[str, Any],
                                                     tmp_path: Path) -> None:
    pipe = _load(cls_name, model_dir(cls_name, model_dirs))
    denoising.make_resumable(pipe)
    assert type(pipe).__name__ == cls_name and type(pipe).__mro__[1].__name__ == cls_name
    kwargs = call_of(cls_name, images)
    whole, resumed, rendered = interrupted_and_resumed(pipe, kwargs, 3, tmp_path)
    total = rendered[-1]  # img2img renders strength x steps of them
    assert rendered == list(range(4, total + 1)), "the resumed call rendered only the steps after the checkpoint"
    assert np.array_equal(resumed, whole), f"max diff {np.abs(resumed - whole).max()}"
    assert not np.array_equal(render(pipe, {**kwargs, "prompt": ["a lighthouse"]}, None), whole), "a real check"


@pytest.mark.parametrize(("scheduler", "config"), [
    ("UniPCMultistepScheduler", {"use_flow_sigmas": True, "prediction_type": "flow_prediction", "flow_shift": 3.0}),
    ("FlowMatchEulerDiscreteScheduler", {"stochastic_sampling": True}),
])
def test_multistep_history_and_torch_rng_are_part_of_the_state(scheduler: str, config: dict[str, Any],
                                                               tiny_wan: Path, images: dict[str, Any],
                                                               tmp_path: Path) -> None:
    import diffusers

    pipe = _load("WanPipeline", tiny_wan)
    pipe.scheduler = getattr(diffusers, scheduler).from_config(pipe.scheduler.config, **config)
    denoising.make_resumable(pipe)
    whole, resumed, _ = interrupted_and_resumed(pipe, call_of("WanPipeline", images), 4, tmp_path)
    assert np.array_equal(resumed, whole)


def test_inpainting_is_not_resumable_and_is_refused_by_name(tiny_model: Path, images: dict[str, Any],
                                                            tmp_path: Path) -> None:
    pipe = _load("FluxInpaintPipeline", tiny_model)
    runtime = RuntimeSpec.model_validate({"name": "t", "outputDir": str(tmp_path), "spec": {
        "model": {"name": str(tiny_model)}, "prompts": ["a"], "runPolicy": {"checkpoint": {"everySteps": 2}}}})
    with pytest.raises(PermanentFailure, match="FluxInpaintPipeline is not a pipeline whose resume") as refused:
        denoising.check_resumable(pipe, runtime)
    assert refused.value.field == CHECKPOINT_FIELD
    denoising.make_resumable(pipe)
    whole, resumed, _ = interrupted_and_resumed(pipe, call_of("FluxInpaintPipeline", images), 3, tmp_path)
    assert not np.array_equal(resumed, whole), "it blends the image back in with its first step's noise"


def test_a_scheduler_whose_state_a_checkpoint_cannot_hold_is_refused_by_name(tiny_model: Path,
                                                                             tmp_path: Path) -> None:
    import diffusers

    pipe = _load("FluxPipeline", tiny_model)
    pipe.scheduler = diffusers.PNDMScheduler.from_config(pipe.scheduler.config)  # keeps numpy arrays
    runtime = RuntimeSpec.model_validate({"name": "t", "outputDir": str(tmp_path), "spec": {
        "model": {"name": str(tiny_model)}, "prompts": ["a"], "generation": {"scheduler": {"name": "PNDMScheduler"}},
        "runPolicy": {"checkpoint": {"everySteps": 2}}}})
    refusal = r"PNDMScheduler\.\w+ is a ndarray, which a checkpoint cannot hold"
    with pytest.raises(PermanentFailure, match=refusal) as e:
        denoising.check_resumable(pipe, runtime)
    assert e.value.field == "spec.generation.scheduler"
