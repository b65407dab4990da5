"""A clock the operator's progress code reads (`clock=`), moved by hand in tests."""

from __future__ import annotations

from datetime import UTC, datetime

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
