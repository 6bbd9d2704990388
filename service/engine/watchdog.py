"""A watchdog thread for the engine: a dead engine thread or a stalled step fails the engine.

Without it, an engine thread that died (or hung inside ``llama_decode``)
would leave health SERVING while every accepted request waited forever. The
watchdog only observes; ``Engine.fail`` does the rest (ends every request with
UNAVAILABLE, refuses new ones, tells the server, which reports NOT_SERVING and
exits non-zero so an orchestrator restarts it).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Watched(Protocol):
    step_started: float | None
    failure: str | None

    def fail(self, cause: str) -> None: ...


class Watchdog:
    """Polls ``engine`` and the thread running it; calls ``engine.fail`` once on trouble."""

    def __init__(self, engine: Watched, thread: threading.Thread, step_timeout_s: float) -> None:
        self.engine = engine
        self.thread = thread
        self.step_timeout_s = step_timeout_s
        self._stop = threading.Event()
        self._poll = min(1.0, step_timeout_s / 4)
        self._thread = threading.Thread(target=self._run, name="engine-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self, now: float) -> str | None:
        """What is wrong with the engine at ``now``, or None."""
        if not self.thread.is_alive():
            return "engine thread exited"
        started = self.engine.step_started
        if started is not None and now - started > self.step_timeout_s:
            return f"engine step running for over {self.step_timeout_s:g} s"
        return None

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            if self.engine.failure is not None:
                return
            problem = self.check(time.monotonic())
            if problem is not None and not self._stop.is_set():
                self.engine.fail(problem)
                return
