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

