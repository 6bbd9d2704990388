"""Coalescing: identical deterministic requests in flight share one computation.

The first request with a key becomes the *leader* and runs; later ones with
the same key *follow*: they wait for the leader's answer. If the leader ends
without an answer (cancelled, failed, refused), its followers wake up with
None and try again, so exactly one of them becomes the next leader.

Event-loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from service.response_cache.store import Entry

POLL_S = 0.05  # how often a follower checks whether its own request was cancelled


class Flight:
    """One running computation of a key."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.entry: Entry | None = None


class Coalescer:
    """Leaders and followers by key."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}

    def running(self, key: str) -> Flight | None:
        """The flight computing ``key`` now, if any."""
        return self._flights.get(key)

    def try_lead(self, key: str) -> bool:
        """Become the leader of ``key``; False when another request already leads it."""
        if key in self._flights:
            return False
        self._flights[key] = Flight()
        return True

    def finish(self, key: str, entry: Entry | None) -> None:
        """The leader of ``key`` ended, with its answer or None; wakes the followers (idempotent)."""
        flight = self._flights.pop(key, None)
        if flight is not None:
            flight.entry = entry
            flight.done.set()

    def in_flight(self) -> int:
        return len(self._flights)

    @staticmethod
    async def follow(flight: Flight, gave_up: Callable[[], bool] = lambda: False) -> Entry | None:
        """The leader's answer; None if it had none or ``gave_up()`` turned true while waiting.

        NOTE: polled rather than raced against a cancellation event so the caller
        needs no extra plumbing (a Generate request cancelled while following is
        only a flag in its stream).
        """
        while not flight.done.is_set():
            if gave_up():
                return None
            try:
                await asyncio.wait_for(flight.done.wait(), POLL_S)
            except TimeoutError:
                continue
        return flight.entry
