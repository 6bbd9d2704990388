"""Waiting without wall-clock races: conditions polled under a generous ceiling, and the few margins
that must stay wall-clock bounds scaled by how busy the machine is.

NOTE: a test's verdict must not depend on how fast a loaded machine runs. Wait for the condition the
test is about (``until``, ``tests.support.helpers.wait_for``), never for a fixed time; where a bound in
seconds is what the test proves (a documented reconnect time, a grace period), give it ``scaled``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

MAX_BUSY_FACTOR = 8.0


def busy_factor() -> float:
    """How many times slower than idle the machine may run now: the 1-minute load average per CPU,
    at least 1, at most ``MAX_BUSY_FACTOR``."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(MAX_BUSY_FACTOR, max(1.0, load))


def scaled(seconds: float) -> float:
    """A wall-clock margin of ``seconds`` on an idle machine, grown with ``busy_factor``."""
    return seconds * busy_factor()


async def until(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.005) -> bool:
    """Let the event loop run until ``predicate`` holds or ``timeout`` seconds pass; its last value."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            return predicate()
        await asyncio.sleep(interval)
    return True
