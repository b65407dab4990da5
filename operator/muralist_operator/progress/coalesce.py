"""The progress endpoint's event loop: one wake-up serves a burst of posts.

The loop's selector lingers `coalesce` seconds (50 ms) once a socket is readable, so one
wake-up serves every post that arrived meanwhile: a wake-up of an asyncio loop costs more than
the post it serves, and 300 posts a second otherwise arrive one by one. With the lean framing of
http1 it took the endpoint from 0.43-0.55 ms of CPU per post to 0.23-0.24 ms
(benchmarks/progress_load.py); a post waits up to 50 ms longer for its answer, which no pod
waits for.
"""

from __future__ import annotations

import asyncio
import selectors
import time

COALESCE_SECONDS = 0.05


class CoalescingSelector(selectors.DefaultSelector):
    """A selector whose `select` lingers `window` seconds once something is ready, then returns
    everything that became ready meanwhile (one wake-up for a burst)."""

    def __init__(self, window: float = COALESCE_SECONDS) -> None:
        super().__init__()
        self.window = window

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        if not ready or self.window <= 0:
            return ready
        time.sleep(self.window)
        position = {key.fd: i for i, (key, _) in enumerate(ready)}
        for key, events in super().select(0):
            i = position.get(key.fd)
            if i is None:
                ready.append((key, events))
            else:
                ready[i] = (key, ready[i][1] | events)
        return ready


def new_event_loop(coalesce: float = COALESCE_SECONDS) -> asyncio.AbstractEventLoop:
    """An event loop on a CoalescingSelector (a plain one when `coalesce` is 0)."""
    return asyncio.SelectorEventLoop(CoalescingSelector(coalesce))
