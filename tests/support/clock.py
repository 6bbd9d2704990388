"""Clocks a test moves by hand.

``FakeClock``: for stores and caches that take ``clock: Callable[[], float]``. ``ShiftedClock``: for code
whose times are compared with ``time.monotonic()`` values made elsewhere (a request's deadline): the
monotonic clock, plus an offset the test moves forward.
"""

from __future__ import annotations

import time


class FakeClock:
    """Returns ``now`` when called; ``advance(s)`` moves it forward."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ShiftedClock:
    """``time.monotonic()`` plus ``offset``; ``advance(s)`` moves it forward (any thread may read it)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds
