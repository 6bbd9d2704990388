"""The engine's inbox: typed messages from any thread to the engine thread, in order.

``Engine.submit``/``abort``/``pause``/``cancel_all``/``stop`` only ``put`` a
message; the engine thread handles them between steps (``drain``). Each message
is a small frozen record, so what travels is checked by mypy (no tuples).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass

from service.request.events import Error
from service.request.sequence import Sequence


@dataclass(frozen=True)
class Submit:
    """An accepted request joins the scheduler's waiting list."""

    seq: Sequence


@dataclass(frozen=True)
class Abort:
    """End ``seq`` wherever it is: CANCELLED, or with ``error`` when given."""

    seq: Sequence
    error: Error | None = None


@dataclass(frozen=True)
class Pause:
    """Stop (``paused``) or resume scheduling ``seq``."""

    seq: Sequence
    paused: bool


@dataclass(frozen=True)
class CancelAll:
    """End every queued and running request with UNAVAILABLE and ``message`` (end of a drain)."""

    message: str


@dataclass(frozen=True)
class Wake:
    """Nothing to do: wakes a blocked ``drain`` (``Engine.stop``)."""


Message = Submit | Abort | Pause | CancelAll | Wake


class Inbox:
    """A multi-producer, single-consumer queue of ``Message``s (thread-safe ``put``)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Message] = queue.SimpleQueue()

    def put(self, message: Message) -> None:
        """Any thread: queue ``message`` for the engine thread."""
        self._queue.put(message)

    def drain(self, block: bool, timeout: float = 0.5) -> Iterator[Message]:
        """Engine thread: the messages queued, in order, until the inbox is empty.

        With ``block``, waits up to ``timeout`` seconds for the first one. Messages put while
        the caller handles earlier ones are yielded too (the iterator ends only on an empty inbox).
        """
        try:
            yield self._queue.get(timeout=timeout) if block else self._queue.get_nowait()
            while True:
                yield self._queue.get_nowait()
        except queue.Empty:
            return
