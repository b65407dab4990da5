"""How long a pod told to stop may take (terminationGracePeriodSeconds): long enough to finish
the item in flight, write it and hand its chunk back (muralist_runtime.world.drain)."""

from __future__ import annotations

import math

from muralist_api.job import DiffusionJob

# The grace period's guess at one item (runPolicy.terminationGracePeriodSeconds overrides it): a
# denoising step of a 1024x1024 image (or of 16 video frames) takes about this long on one GPU for
# the large models people batch (a deliberately generous figure: a pod killed early loses its item,
# one that ends early loses nothing), scaled by pixels, frames and batch size.
STEP_SECONDS_PER_MEGAPIXEL = 0.5
GRACE_MARGIN_SECONDS = 30  # writing what was rendered, handing the chunk back, the kubelet's own
GRACE_MAX_SECONDS = 3600


def termination_grace_seconds(job: DiffusionJob) -> int:
    """How long a pod told to stop may take: twice the estimate of one pipeline call, plus a margin."""
    asked = job.spec.run_policy.termination_grace_period_seconds
    if asked is not None:
        return asked
    gen = job.spec.generation
    megapixels = gen.height * gen.width / (1024 * 1024)
    frames = max(1.0, (gen.num_frames or 1) / 16)
    item = gen.steps * STEP_SECONDS_PER_MEGAPIXEL * max(megapixels, 0.05) * frames * gen.batch_size
    return min(GRACE_MAX_SECONDS, math.ceil(2 * item) + GRACE_MARGIN_SECONDS)
