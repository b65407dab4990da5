"""The progress bar `Client.wait` and `muralist submit --follow` draw: tqdm fed by status.progress.

The bar only shows what the status says (images done of the total, the operator's rate and
ETA); it draws when the status changes, which the operator writes at most once a second.
"""

from __future__ import annotations

import sys
from typing import TextIO

from muralist_api.status import DiffusionJobStatus

from muralist.status_text import bar_state

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class ProgressBar:
    """A tqdm bar for one job; `show(status)` redraws it, `close()` leaves the last line."""

    def __init__(self, name: str, file: TextIO | None = None):
        from tqdm import tqdm

        self.name = name
        self._bar = tqdm(total=None, desc=name, unit="img", bar_format=BAR_FORMAT, file=file or sys.stderr,
                         dynamic_ncols=True, leave=True)

    def show(self, status: DiffusionJobStatus) -> None:
        state = bar_state(status.progress)
        self._bar.total = state.total
        self._bar.n = state.done
        self._bar.set_description_str(f"{self.name} {status.phase}", refresh=False)
        self._bar.set_postfix_str(state.suffix, refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()
