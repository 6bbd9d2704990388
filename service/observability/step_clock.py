"""Where an engine step's time goes: wall seconds per phase, summed over steps.

The engine thread calls ``start`` when a step begins and ``lap(phase)`` as each
phase ends; every lap charges the time since the previous one to its phase.
Phases, in step order:

* ``plan``: speculative proposals, the scheduler's plan, KV cell operations;
* ``batch``: building the decode's token, position and lane arrays (Python);
* ``decode``: ``llama_decode`` (inside llama.cpp, logits copied to host included);
* ``sample``: grammar masks, penalties, sampling, log-probabilities;
* ``update``: verifying drafts, appending tokens, stop checks, finishing;
* ``emit``: turning new tokens into text deltas and handing events to the loop.

``decode`` is llama.cpp's time; every other phase is Python (and numpy) on the
engine thread. ``snapshot`` may be called from any thread: it copies a dict of
floats the engine thread updates in place (a torn read costs at most one lap).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

PHASES = ("plan", "batch", "decode", "sample", "update", "emit")


@dataclass(frozen=True)
class StepTimes:
    """Steps timed and the wall seconds of each phase over them (``PHASES`` order)."""

    steps: int
    seconds: dict[str, float]


class StepClock:
    """Per-phase wall time of engine steps (engine thread writes; see the module docstring)."""

    def __init__(self) -> None:
        self._seconds = dict.fromkeys(PHASES, 0.0)
        self._steps = 0
        self._t: float | None = None

    def start(self) -> None:
        """A step begins: the next lap is measured from now."""
        self._t = time.perf_counter()
        self._steps += 1

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap (or ``start``) to ``phase``; no-op outside a step."""
        if self._t is None:
            return
        now = time.perf_counter()
        self._seconds[phase] += now - self._t
        self._t = now

    def stop(self) -> None:
        """The step ended (time after the last lap is not charged)."""
        self._t = None

    def snapshot(self) -> StepTimes:
        return StepTimes(self._steps, dict(self._seconds))
