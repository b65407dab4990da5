"""What a rank's run learns and holds: the `RunPlan` (what checking the spec found and planned) and the `RunState`
(what the run has set up so far, so that a failure can still report and clean up).

No stage of its own: main.py fills it step by step and the claim/render loop reads it, so it sits
between them in the import layers, above the stages whose objects it holds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from muralist_api.contract import CheckpointSteps, Counts
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec
from muralist_api.step_cache import CacheSample

from .model.checkpointing import Checkpointing
from .model.compiling import CompiledTransformer
from .model.strategies import ParallelStrategy, Plan
from .outputs.layouts import FilesLayout, WebDatasetLayout
from .outputs.writer import BackgroundWriter, JobFile
from .report.progress import RankProgress
from .report.push import PodReporter
from .work.chunks import WorkPlan
from .work.claims import ClaimClient, ClaimServer
from .work.rows import Rows
from .world.distributed import DistributedWorld

T = TypeVar("T")


@dataclass
class RunPlan:
    """What checking the spec learned and planned: the spec, the strategy's plan, the rows and the work plan,
    the model. (Not the DiffusionJob, nor the Kubernetes Job: this rank's plan of its run.)"""

    runtime: RuntimeSpec
    strategy: ParallelStrategy
    plan: Plan
    rows: Rows
    work: WorkPlan
    first: Item  # the canary's and the warm-up's item
    source: str
    revision: str | None
    gpu: bool


@dataclass
class RunState:
    """What a run holds while it goes, so that a failure can still report and clean up.

    The world, the job file and the progress exist once the world is set up (main.set_up_world),
    and so do a writing rank's layout and claims: the loop reads them as such, and reading one
    before (or a layout on a rank that does not write) is a bug (NotSetUp). The rest belongs to
    some ranks only and is None on the others.
    """

    timings: dict[str, float] = field(default_factory=dict)
    learned: dict[str, Any] = field(default_factory=dict)  # of the model, for the job file (a calibrated cache)
    started: float = field(default_factory=time.perf_counter)
    server: ClaimServer | None = None  # the first pod's first rank
    reporter: PodReporter | None = None  # each pod's first rank
    background: BackgroundWriter | None = None  # writing ranks, while they generate
    merged: Counts | None = None  # the job's items as the merge found them (the first pod's first rank)
    merged_steps: CheckpointSteps | None = None  # and runPolicy.checkpoint's steps saved and lost
    checkpoints: Checkpointing | None = None  # runPolicy.checkpoint, while it generates
    compiled: CompiledTransformer | None = None  # generation.compile: the sizes compiled so far
    _world: DistributedWorld | None = None
    _jobfile: JobFile | None = None
    _progress: RankProgress | None = None
    _layout: FilesLayout | WebDatasetLayout | None = None  # writing ranks only
    _claims: ClaimClient | None = None  # writing ranks only

    @property
    def world(self) -> DistributedWorld:
        return _set_up(self._world, "world")

    @world.setter
    def world(self, world: DistributedWorld) -> None:
        self._world = world

    @property
    def jobfile(self) -> JobFile:
        return _set_up(self._jobfile, "jobfile")

    @jobfile.setter
    def jobfile(self, jobfile: JobFile) -> None:
        self._jobfile = jobfile

    @property
    def progress(self) -> RankProgress:
        return _set_up(self._progress, "progress")

    @progress.setter
    def progress(self, progress: RankProgress) -> None:
        self._progress = progress

    @property
    def writes(self) -> bool:
        """Whether this rank writes outputs (a group's first rank): it has a layout and claims."""
        return self._layout is not None

    @property
    def layout(self) -> FilesLayout | WebDatasetLayout:
        if self._layout is None:  # (not _set_up: mypy would widen a union's type to object)
            raise NotSetUp("RunState.layout is read on a rank that writes nothing, or before it is set up")
        return self._layout

    @layout.setter
    def layout(self, layout: FilesLayout | WebDatasetLayout) -> None:
        self._layout = layout

    @property
    def claims(self) -> ClaimClient:
        return _set_up(self._claims, "claims")

    @claims.setter
    def claims(self, claims: ClaimClient) -> None:
        self._claims = claims

    @property
    def counts(self) -> Counts:
        return self._progress.counts if self._progress is not None else Counts()

    @property
    def cache_sample(self) -> CacheSample | None:
        """generation.cache.verify's items this rank measured (None: none)."""
        return self._progress.state.cache_sample if self._progress is not None else None

    def drained(self) -> None:
        """A rank that stopped on request is done as far as its pod's first rank's wait goes."""
        if self._progress is not None:
            self._progress.finished()

    def finish_writes(self) -> None:
        """On a failure: let queued items reach the disk, raising nothing."""
        if self.background is not None:
            self.background.close(raise_error=False)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.close()
        if self.reporter is not None:
            self.reporter.close()  # the final counts reach the operator on failures too
        if self._claims is not None:
            self._claims.close()
        if self.server is not None:
            self.server.close()
        if self._world is not None:
            self._world.close()
        if self.compiled is not None:
            self.compiled.close()


class NotSetUp(RuntimeError):
    """A part of the run read before the step that sets it up."""


def _set_up(value: T | None, name: str) -> T:
    if value is None:
        raise NotSetUp(f"RunState.{name} is read before it is set up, or on a rank that has none")
    return value
