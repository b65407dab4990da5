"""runPolicy.checkpoint on a rank: when an item's denoising state is saved, where an item resumes, and what that
saved and lost.

For each item the claim loop renders (`Checkpointing.rendering`), the group's first rank looks for the item's
checkpoint and note (outputs/checkpoints.py) and keeps the checkpoint when it was made for the item's request
(its digest), by the same pipeline and step count, on the same torch and diffusers; it shares what it found with
the group (a context-parallel group's ranks all hold the gathered latents, so every rank resumes from them). At
each step's end (model/denoising.py hands it over) the first rank saves the state every `everySteps` steps and
writes the note; with `onTerminate`, the group asks whether the pod was told to stop (world/drain.py: one
collective per step in a group of several ranks) and, if so, saves the state there and stops the item
(drain.StoppedMidItem): the claim loop hands its chunk back. Once the item is written, its files go (`written`);
its record gets `resumedFromStep`, `stepsSaved` and `stepsLost` (`record`).

Timings: checkpointSeconds (capturing and writing the saves, summed) and checkpointsWritten (how many).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from muralist_api.items import Item
from muralist_api.pods import Checkpoint
from muralist_api.runtime_spec import RuntimeSpec

from ..outputs import checkpoints, requests
from ..outputs.checkpoints import Account, resume_account
from ..testing import faults
from ..world import drain
from ..world.distributed import DistributedWorld
from . import denoising
from .denoising import DenoisingState, ItemDenoising, StepEnd

log = logging.getLogger("muralist")


def library_versions() -> dict[str, str]:
    """What a checkpoint must have been made with to resume exactly (a scheduler's state, torch's RNG)."""
    out = {}
    for name in ("torch", "diffusers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


@dataclass
class Checkpointing:
    """One rank's checkpoints: the job's policy, the folder, and each rendered item's account."""

    runtime: RuntimeSpec
    world: DistributedWorld
    policy: Checkpoint
    timings: dict[str, float]
    accounts: dict[str, Account] = field(default_factory=dict)

    @classmethod
    def for_job(cls, runtime: RuntimeSpec, pipe: Any, world: DistributedWorld,
                timings: dict[str, float]) -> Checkpointing | None:
        """None when the job has no checkpoints; else the pipeline checked (exit 78 naming the option when its
        item cannot resume exactly) and made resumable."""
        policy = runtime.spec.run_policy.checkpoint
        if policy is None:
            return None
        denoising.check_resumable(pipe, runtime)
        denoising.make_resumable(pipe)
        return cls(runtime, world, policy, timings)

    @property
    def root(self) -> Path:
        return Path(self.runtime.output_dir)

    @property
    def writes(self) -> bool:
        return self.world.layout.writes_images

    def _envelope(self, pipe: Any, digest: str, state: DenoisingState) -> dict[str, Any]:
        return {"requestDigest": digest, "pipeline": denoising.pipeline_name(pipe), "step": state.step,
                "steps": state.steps, "versions": library_versions()}

    def _found(self, pipe: Any, item: Item, digest: str) -> tuple[DenoisingState | None, Account]:
        """The first rank: the item's checkpoint when this render may resume from it, and the item's account."""
        note = checkpoints.read_note(self.root, item.key)
        if note is not None and note.request_digest != digest:
            note = None  # of another request: what it lost is no loss of this one
        found = checkpoints.read(self.root, item.key)
        state = None
        if found is not None:
            envelope, payload = found
            why = self._unusable(pipe, digest, envelope)
            if why is None:
                state = DenoisingState.from_payload(payload)
            elif envelope.get("requestDigest") == digest:
                log.warning("item %s: its checkpoint at step %s is not resumed (%s); rendering from its first step",
                            item.key, envelope.get("step"), why)
        account = resume_account(state.step if state is not None else None, note)
        if state is not None:
            log.info("item %s resumes from its checkpoint at step %d of %d", item.key, state.step, state.steps)
        return state, account

    def _unusable(self, pipe: Any, digest: str, envelope: dict[str, Any]) -> str | None:
        if envelope.get("requestDigest") != digest:
            return "made for another request"
        if envelope.get("pipeline") != denoising.pipeline_name(pipe):
            return f"made by {envelope.get('pipeline')}"
        if envelope.get("versions") != library_versions():
            return f"made with {envelope.get('versions')}, this image has {library_versions()}"
        return None

    @contextlib.contextmanager
    def rendering(self, pipe: Any, item: Item) -> Iterator[None]:
        """The pipeline call of `item` inside: resumed from its checkpoint, saving as the policy says."""
        digest = requests.record(self.runtime, item)["requestDigest"] if self.writes else ""
        state, account = self._found(pipe, item, digest) if self.writes else (None, Account())
        if self.world.layout.group_size > 1:
            state, account = self.world.share_in_group((state, account))
        if state is not None and state.step >= state.steps:
            state = None  # a checkpoint is never written after the last step; be safe
        self.accounts[item.key] = account
        steps = ItemDenoising(state, lambda end: self._step_end(pipe, item.key, digest, account, end))
        with denoising.attached(pipe, steps):
            yield

    def _step_end(self, pipe: Any, key: str, digest: str, account: Account, end: StepEnd) -> None:
        saved = False
        if self.writes:
            if end.step % self.policy.every_steps == 0 and end.step < end.steps:
                self._save(pipe, key, digest, end)
                saved = True
            checkpoints.write_note(self.root, key, account.note(digest, end.step))
        faults.step_ended()
        if not self.policy.on_terminate or end.step >= end.steps:
            return
        stop = drain.requested() if self.writes else None
        if self.world.layout.group_size > 1:
            stop = self.world.share_in_group(stop)
        if stop:
            if self.writes and not saved:
                self._save(pipe, key, digest, end)
            raise drain.StoppedMidItem(f"item {key} saved at step {end.step} of {end.steps}")

    def _save(self, pipe: Any, key: str, digest: str, end: StepEnd) -> None:
        start = time.perf_counter()
        state = end.capture()
        size = checkpoints.write(self.root, key, self._envelope(pipe, digest, state), state.payload())
        seconds = time.perf_counter() - start
        self.timings["checkpointSeconds"] = self.timings.get("checkpointSeconds", 0.0) + seconds
        self.timings["checkpointsWritten"] = self.timings.get("checkpointsWritten", 0) + 1
        log.debug("item %s: checkpoint at step %d (%d bytes, %.3fs)", key, end.step, size, seconds)

    def record(self, key: str) -> dict[str, int]:
        """The item's record's fields: resumedFromStep, stepsSaved, stepsLost (those not 0)."""
        account = self.accounts.get(key)
        return account.record() if account is not None else {}

    def written(self, key: str) -> None:
        """The item's output is written (or its failure recorded): its checkpoint and note go, if this rank rendered
        it (a kept item's leftovers go at the merge)."""
        if self.accounts.pop(key, None) is not None and self.writes:
            checkpoints.remove(self.root, key)
