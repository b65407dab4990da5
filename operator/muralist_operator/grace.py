"""How long a pod told to stop may take (terminationGracePeriodSeconds): long enough to finish
the item in flight, write it and hand its chunk back (muralist_runtime.world.drain); with
runPolicy.checkpoint's onTerminate, long enough to end the step in flight and write one checkpoint
of the item's state (the item resumes where it was, in whichever pod takes its chunk next)."""

from __future__ import annotations

import math

from muralist_api.generation import Generation
from muralist_api.job import DiffusionJob

# The grace period's guess at one item (runPolicy.terminationGracePeriodSeconds overrides it): a
# denoising step of a 1024x1024 image (or of 16 video frames) takes about this long on one GPU for
# the large models people batch (a deliberately generous figure: a pod killed early loses its item,
# one that ends early loses nothing), scaled by pixels, frames and batch size.
STEP_SECONDS_PER_MEGAPIXEL = 0.5
GRACE_MARGIN_SECONDS = 30  # writing what was rendered, handing the chunk back, the kubelet's own
GRACE_MAX_SECONDS = 3600
# A checkpoint holds the item's latents: 16 channels of float32 per 8x8 pixels (Flux, Wan 2.1; a generous
# figure for models of fewer channels) of each latent frame (a 4x temporal compression, Wan's); written at
# this rate (a slow network volume or a bucket: generous, as the step is).
CHECKPOINT_BYTES_PER_PIXEL = 16 * 4 / 64
CHECKPOINT_BYTES_PER_SECOND = 20 * 1024 * 1024


def step_seconds(gen: Generation) -> float:
    """The guess at one denoising step of one pipeline call."""
    megapixels = gen.height * gen.width / (1024 * 1024)
    frames = max(1.0, (gen.num_frames or 1) / 16)
    return STEP_SECONDS_PER_MEGAPIXEL * max(megapixels, 0.05) * frames * gen.batch_size


def checkpoint_write_seconds(gen: Generation) -> float:
    """The guess at writing one checkpoint of an item (its latents, at CHECKPOINT_BYTES_PER_SECOND)."""
    latent_frames = ((gen.num_frames or 1) - 1) // 4 + 1
    return gen.height * gen.width * CHECKPOINT_BYTES_PER_PIXEL * latent_frames / CHECKPOINT_BYTES_PER_SECOND


def termination_grace_seconds(job: DiffusionJob) -> int:
    """How long a pod told to stop may take: twice the estimate of one pipeline call, plus a margin; with
    checkpoints written on a stop, twice the estimate of one step and one checkpoint's write, plus the margin."""
    asked = job.spec.run_policy.termination_grace_period_seconds
    if asked is not None:
        return asked
    gen = job.spec.generation
    checkpoint = job.spec.run_policy.checkpoint
    if checkpoint is not None and checkpoint.on_terminate:
        work = step_seconds(gen) + checkpoint_write_seconds(gen)
    else:
        work = gen.steps * step_seconds(gen)
    return min(GRACE_MAX_SECONDS, math.ceil(2 * work) + GRACE_MARGIN_SECONDS)
