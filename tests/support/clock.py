"""A clock the test moves by hand, for stores and caches that take ``clock: Callable[[], float]``."""

from __future__ import annotations


class FakeClock:
    """Returns ``now`` when called; ``advance(s)`` moves it forward."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
