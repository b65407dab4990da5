"""A repeated prompt's encoding given again (model/prompt_memo.py), on the bundled tiny Flux."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxPipeline
from muralist_runtime.model import prompt_memo, settled
from muralist_runtime.model.bundled import SHAPES_TEXT_TOKENS, bundled_model

PROMPTS = ["a red circle on a blue background", "a green square on a red background"]


@pytest.fixture
def pipe() -> FluxPipeline:
    pipe = FluxPipeline.from_pretrained(bundled_model("muralist/tiny-shapes-flux"), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def render(pipe: FluxPipeline, prompt: str | list[str], seed: int) -> torch.Tensor:
    prompts = [prompt] if isinstance(prompt, str) else prompt
    with torch.inference_mode():
        return pipe(prompts, height=64, width=64, num_inference_steps=2, max_sequence_length=SHAPES_TEXT_TOKENS,
                    generator=[torch.Generator().manual_seed(seed + i) for i in range(len(prompts))],
                    output_type="pt").images


def encoder_calls(pipe: FluxPipeline) -> list[int]:
    """A counter of the text encoders' forward calls."""
    calls = [0]

    def count(*_: object) -> None:
        calls[0] += 1

    pipe.text_encoder.register_forward_pre_hook(count)
    pipe.text_encoder_2.register_forward_pre_hook(count)
    return calls


def test_a_repeated_prompt_is_encoded_once_and_renders_the_same_pixels(pipe: FluxPipeline) -> None:
    jobs = [(p, seed) for seed in range(3) for p in PROMPTS] + [(PROMPTS, 7), (PROMPTS[::-1], 7)]
    before = [render(pipe, p, seed) for p, seed in jobs]
    settled.settle(pipe)
    calls = encoder_calls(pipe)
    after = [render(pipe, p, seed) for p, seed in jobs]
    for b, a in zip(before, after, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Two prompts and two batches (a batch is one key, its order part of it), each encoded once by each encoder.
    assert calls[0] == 2 * 4
    memo = prompt_memo.memo_of(pipe)
    assert memo is not None and (memo.hits, memo.misses) == (4, 4)


def test_a_call_given_embeddings_or_other_arguments_is_encoded_as_asked(pipe: FluxPipeline) -> None:
    settled.settle(pipe)
    calls = encoder_calls(pipe)
    with torch.inference_mode():
        embeds, pooled, _ = pipe.encode_prompt(PROMPTS[0], None, max_sequence_length=SHAPES_TEXT_TOKENS)
        pipe.encode_prompt(None, None, prompt_embeds=embeds, pooled_prompt_embeds=pooled)
        pipe.encode_prompt(PROMPTS[0], None, max_sequence_length=SHAPES_TEXT_TOKENS - 1)
        pipe.encode_prompt(PROMPTS[0], PROMPTS[1], max_sequence_length=SHAPES_TEXT_TOKENS)
        again, _, _ = pipe.encode_prompt(prompt=PROMPTS[0], prompt_2=None, max_sequence_length=SHAPES_TEXT_TOKENS)
    # Given embeddings, nothing is encoded; another length or second prompt is another key; the same call with
    # its arguments named is the first one's key.
    assert calls[0] == 2 * 3
    torch.testing.assert_close(again, embeds, rtol=0, atol=0)


def test_each_call_gets_its_own_copy(pipe: FluxPipeline) -> None:
    settled.settle(pipe)
    with torch.inference_mode():
        first, _, _ = pipe.encode_prompt(PROMPTS[0], None, max_sequence_length=SHAPES_TEXT_TOKENS)
        kept = first.clone()
        first.zero_()  # what a pipeline might do to its embeddings
        second, _, _ = pipe.encode_prompt(PROMPTS[0], None, max_sequence_length=SHAPES_TEXT_TOKENS)
        second.add_(1)
        third, _, _ = pipe.encode_prompt(PROMPTS[0], None, max_sequence_length=SHAPES_TEXT_TOKENS)
    torch.testing.assert_close(third, kept, rtol=0, atol=0)


def test_the_memo_keeps_what_fits_and_drops_the_least_recently_used() -> None:
    memo = prompt_memo.PromptMemo(limit=3 * 16)
    tensor = torch.zeros(4)  # 16 bytes
    for name in "abc":
        memo.put((name,), (tensor, None))
    assert memo.get(("a",)) is not None  # used: "b" is now the oldest
    memo.put(("d",), (tensor, None))
    assert memo.get(("b",)) is None
    assert all(memo.get((name,)) is not None for name in "acd")
    memo.put(("big",), torch.zeros(13))  # more than the whole limit: not kept, nothing dropped for it
    assert memo.get(("big",)) is None and memo.size == 3 * 16
