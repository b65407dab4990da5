"""generation.cache.verify: a step cache held to the quality the job allows.

The job's first `sample` items (muralist_api.step_cache.CacheVerify.sample_count) are the sample:
every rank knows them from the spec and the plan, without talking. When a group renders one
with the cache, it renders it again without (same seed: hooks.cache_paused) and compares the
two (quality.py: PSNR and SSIM on the 8-bit pixels). The measures go in the item's
manifest row (verdict.py); every rank of the group computes the same ones from
the same pixels, so a verdict ends or changes the group's run on all its ranks together.

Below a threshold:
- onFail Fail: a PermanentFailure naming the threshold and the measured value (exit 78: the
  setting is wrong, not the pod);
- onFail DisableCache: the cache is turned off for the rest of the job: the item is written as
  rendered without it, `cache-off.json` in the job folder says why, and every group reads that
  before each chunk (so do retried pods). Items another group rendered before it read it keep
  the cache; their rows say so (`cache`), the others' do not.

The claim loop (render/claim_loop.py) makes the gate with what it needs of the stages above the step
cache: the render (model/call.py's `render_checked`) and the job folder's storage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from muralist_api.contract import PermanentFailure
from muralist_api.items import Item
from muralist_api.runtime_spec import RuntimeSpec
from muralist_api.step_cache import VERIFY_FIELD, CacheSample, CacheSpec, CacheVerify

from ..world.distributed import DistributedWorld
from . import hooks, quality
from .verdict import FolderFiles, read_off, row_measures, write_off

log = logging.getLogger("muralist")

# As model/call.py has them: an item's output and None, or None and why the item failed; the step hook.
Checked = tuple[Any, str | None]
StepHook = Callable[[], None]


class RenderChecked(Protocol):
    """model/call.py's `render_checked`: the items rendered as the pipeline is now, each checked."""

    def __call__(self, pipe: Any, runtime: RuntimeSpec, batch: Sequence[Item],
                 on_step: StepHook | None = None) -> list[Checked]: ...


@dataclass
class CacheGate:
    runtime: RuntimeSpec
    cache: CacheSpec
    verify: CacheVerify
    first_item: int  # the plan's first item number
    count: int  # items sampled, from the first on
    root: Path  # the job folder
    files: FolderFiles  # its storage
    render: RenderChecked
    off: dict[str, Any] | None = None  # the verdict that turned the cache off; None while it is on
    measured: list[tuple[float, float]] = field(default_factory=list)  # (psnr, ssim) of this rank's samples

    @classmethod
    def for_job(cls, runtime: RuntimeSpec, first_row: int, total_items: int, files: FolderFiles,
                render: RenderChecked) -> CacheGate | None:
        cache = runtime.spec.generation.cache
        if cache is None or cache.verify is None or total_items == 0:
            return None
        first = first_row * runtime.spec.generation.images_per_prompt
        return cls(runtime, cache, cache.verify, first, cache.verify.sample_count(total_items),
                   Path(runtime.output_dir), files, render)

    def sampled(self, item: Item) -> bool:
        number = item.number(self.runtime.spec.generation.images_per_prompt) - self.first_item
        return 0 <= number < self.count

    def follow(self, pipe: Any, world: DistributedWorld, writes: bool) -> None:
        """Before a chunk: turn the cache off when another group's verdict (or an earlier attempt's)
        did; the group's first rank reads the folder, and its group follows it."""
        if self.off is not None:
            return
        found = world.share_in_group(read_off(self.files, self.root) if writes else None)
        if found is not None:
            self._turn_off(pipe, found, "the job's")

    def check(self, pipe: Any, batch: list[Item], results: list[Checked], on_step: StepHook | None,
              writes: bool) -> list[Checked]:
        """The batch's results, its sampled items measured against their renders without the cache
        (and the verdict applied: raised, or the cache turned off and the uncached renders kept)."""
        if self.off is not None:  # rendered without the cache: the rows do not name it
            for output, _ in results:
                if output is not None:
                    output.metadata["cache"] = None
            return results
        todo = [i for i, (item, (output, _)) in enumerate(zip(batch, results, strict=True))
                if output is not None and self.sampled(item)]
        return self._measure(pipe, batch, list(results), todo, on_step, writes) if todo else results

    def _measure(self, pipe: Any, batch: list[Item], results: list[Checked], todo: list[int],
                 on_step: StepHook | None, writes: bool) -> list[Checked]:
        with hooks.cache_paused(pipe):
            plain = self.render(pipe, self.runtime, [batch[i] for i in todo], on_step=on_step)
        measured = []
        for index, (reference, _) in zip(todo, plain, strict=True):
            item, cached = batch[index], results[index][0]
            if reference is None or cached is None:
                continue  # the uncached render diverged: nothing to compare with
            psnr = quality.psnr(reference.pixels(), cached.pixels())
            ssim = quality.ssim(reference.pixels(), cached.pixels())
            self.measured.append((psnr, ssim))
            cached.metadata["cacheVerify"] = row = row_measures(psnr, ssim)
            log.info("cache verify: item %s: PSNR %s, SSIM %.4f against the render without %s", item.key,
                     "inf (identical)" if row.get("identical") else f"{psnr:.2f} dB", ssim, self.cache.type)
            measured.append((index, reference, row, self._missed(psnr, ssim)))
        failing = [m for m in measured if m[3] is not None]
        if not failing:
            return results
        index, _, row, missed = failing[0]
        assert missed is not None
        name, said = missed
        item = batch[index]
        if self.verify.on_fail == "Fail":
            raise PermanentFailure(f"{VERIFY_FIELD}.{name}", f"{self.cache.type} {dict(self.cache.options)} costs "
                                   f"more than the job allows: item {item.key} (seed {item.seed}) has {said} against "
                                   f"its render without the cache; use a milder setting, a lower {name}, or onFail: "
                                   "DisableCache")
        verdict = {"item": item.key, "index": item.number(self.runtime.spec.generation.images_per_prompt),
                   "missed": name, "threshold": self.verify.thresholds()[name], **row,
                   "message": f"{said} against the render without {self.cache.type}"}
        if writes:
            write_off(self.files, self.root, verdict)
        self._turn_off(pipe, verdict, "this group's")
        # From the failing item on, the sampled items go out as rendered without the cache (the
        # better images of the two), their rows keeping what the cached renders measured.
        for later, reference, later_row, _ in measured:
            if later >= index:
                reference.metadata.update(cacheVerify=later_row, cache=None)
                results[later] = (reference, None)
        return results

    def _missed(self, psnr: float, ssim: float) -> tuple[str, str] | None:
        """(the threshold missed, the measure in words), or None when the item meets them."""
        if self.verify.min_psnr is not None and psnr < self.verify.min_psnr:
            return "minPsnr", f"PSNR {psnr:.2f} dB, below minPsnr {self.verify.min_psnr:g}"
        if self.verify.min_ssim is not None and ssim < self.verify.min_ssim:
            return "minSsim", f"SSIM {ssim:.4f}, below minSsim {self.verify.min_ssim:g}"
        return None

    def _turn_off(self, pipe: Any, verdict: dict[str, Any], whose: str) -> None:
        pipe.transformer.disable_cache()
        self.off = verdict
        log.warning("cache verify: %s verdict turns %s off for the rest of the job (item %s: %s)", whose,
                    self.cache.type, verdict.get("item"), verdict.get("message"))

    def sample(self) -> CacheSample | None:
        """What this rank measured, for its rank file and the pod's termination message (the job file
        sums every rank's rows); None before it measured anything."""
        if not self.measured:
            return None
        finite = [p for p, _ in self.measured if p != float("inf")]
        return CacheSample(len(self.measured), min(finite) if finite else None, min(s for _, s in self.measured),
                           self.off is not None)
