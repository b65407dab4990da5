"""A loaded pipeline's per-call look-ups found once (model/settled.py), on the bundled tiny Flux."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxPipeline
from diffusers.hooks import group_offloading
from diffusers.pipelines.flux import pipeline_flux
from muralist_runtime.model import denoising, settled
from muralist_runtime.model.bundled import SHAPES_TEXT_TOKENS, bundled_model

PROMPT = "a red circle on a blue background"


@pytest.fixture
def pipe() -> FluxPipeline:
    pipe = FluxPipeline.from_pretrained(bundled_model("muralist/tiny-shapes-flux"), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def render(pipe: FluxPipeline, prompt: str = PROMPT) -> torch.Tensor:
    with torch.inference_mode():
        return pipe(prompt, height=64, width=64, num_inference_steps=2, max_sequence_length=SHAPES_TEXT_TOKENS,
                    generator=torch.Generator().manual_seed(0), output_type="pt").images


def test_a_settled_pipeline_looks_nothing_up_and_renders_as_before(pipe: FluxPipeline,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    before = render(pipe)
    settled.settle(pipe)
    settled.settle(pipe)  # a second call changes nothing
    assert isinstance(pipe, FluxPipeline) and type(pipe).__name__ == "FluxPipeline"
    assert type(pipe).__mro__[1] is FluxPipeline, "one twin, not a twin of a twin"
    denoising.make_resumable(pipe)  # a checkpointed job's twin, on top
    assert denoising.pipeline_name(pipe) == "FluxPipeline"

    def looked_up(*_: object) -> None:
        raise AssertionError("looked up again")

    monkeypatch.setattr(group_offloading, "_get_group_onload_device", looked_up)
    monkeypatch.setattr(type(pipe.tokenizer), "tokenize", looked_up)
    assert pipe._execution_device == torch.device("cpu")
    assert pipe.maybe_convert_prompt(PROMPT, pipe.tokenizer) == PROMPT
    assert pipeline_flux.get_module_execution_device(pipe.vae) == torch.device("cpu")
    with pytest.raises(AssertionError, match="looked up again"):  # a module of no settled pipeline: as before
        pipeline_flux.get_module_execution_device(torch.nn.Linear(2, 2))
    monkeypatch.undo()
    torch.testing.assert_close(render(pipe), before, rtol=0, atol=0)


def test_a_tokenizer_with_multi_vector_tokens_still_has_its_prompts_rewritten(pipe: FluxPipeline) -> None:
    pipe.tokenizer.add_tokens(["<shape>", "<shape>_1"])  # a textual inversion of two vectors
    settled.settle(pipe)
    assert pipe.maybe_convert_prompt("a <shape> on blue", pipe.tokenizer) == "a <shape> <shape>_1 on blue"
    assert pipe.maybe_convert_prompt("a <shape> on blue", pipe.tokenizer_2) == "a <shape> on blue"
