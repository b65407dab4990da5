"""Work items and determinism: what each image is, and the seed it gets.

Pure functions shared by the runtime (the shard plan, the writer) and the operator's counts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .api import Generation, PromptSpec


class ImageTask(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_index: int
    image_index: int
    prompt: str
    negative_prompt: str | None
    seed: int

    @property
    def key(self) -> str:
        return f"{self.prompt_index:05d}-{self.image_index:03d}"


def image_seed(
    base_seed: int, prompt_seed: int | None, prompt_index: int, image_index: int, images_per_prompt: int
) -> int:
    """An image's seed depends only on the seeds and its indices, never on the world layout.

    A prompt with its own seed renders image i with seed + i, like a plain diffusers call with
    that seed. Otherwise images are numbered through the job from the base seed.
    """
    if prompt_seed is not None:
        return prompt_seed + image_index
    return base_seed + prompt_index * images_per_prompt + image_index


def image_tasks(prompts: list[PromptSpec], generation: Generation) -> list[ImageTask]:
    return [
        ImageTask(
            prompt_index=p,
            image_index=i,
            prompt=prompt.text,
            negative_prompt=prompt.negative_prompt,
            seed=image_seed(generation.seed, prompt.seed, p, i, generation.images_per_prompt),
        )
        for p, prompt in enumerate(prompts)
        for i in range(generation.images_per_prompt)
    ]

