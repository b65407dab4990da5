"""The counts of images that a termination message and a progress report carry."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counts:
    """Images of one rank (or one pod, summed): done now, kept from before, failed, in all; and of those done
    now, how many replaced an output made before for another request (a corrected prompt, an edited row)."""

    completed: int = 0
    skipped: int = 0
    failed: int = 0
    total: int = 0
    rerendered: int = 0



@dataclass
class CheckpointSteps:
    """runPolicy.checkpoint's account of a job's denoising steps, as the merge found them in the manifest: steps
    that resumed items took from their checkpoints instead of rendering them again (`saved`), and steps rendered
    again because an item's pod stopped after its last checkpoint (`lost`)."""

    saved: int = 0
    lost: int = 0

    def to_wire(self) -> dict[str, int]:
        return {"stepsSaved": self.saved, "stepsLost": self.lost}

    @classmethod
    def from_wire(cls, doc: object) -> CheckpointSteps | None:
        if not isinstance(doc, dict):
            return None
        values = [doc.get(k, 0) for k in ("stepsSaved", "stepsLost")]
        return cls(*(v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0 for v in values))
