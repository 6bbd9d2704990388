"""``Flight``: one request inside the lifecycle, as its front end holds it.

A front end opens a flight with a ``Sink`` (``Intake.open``), hands it to
``Intake.run``, and from then on may ``cancel`` or ``pause`` it at any stage:
while it is prepared, while it waits on the response cache, while the engine
runs it. Contract, for every flight:

* the sink receives ``Delta`` events, then exactly one terminal event: an
  ``Error``, or the ``Done`` of its last choice (``terminal=True``); with
  ``n`` choices each earlier choice's ``Done`` comes with ``terminal=False``;
* nothing reaches the sink after the terminal event;
* with ``after`` (the previous request of the same Generate stream), the
  flight is admitted (cache, submit) only once ``after`` was submitted,
  ended, or is waiting for an identical request's answer: requests of one
  stream enter in the order they were sent, although they are prepared in
  parallel (and the scheduler orders by ``arrival``, taken when the flight
  opened);
* a cancel before submission ends the flight at the next stage boundary
  (a ``Done`` CANCELLED per choice, or the cancel's own ``Error``); after submission it
  aborts every choice in the engine, whose terminal events follow.

Event loop only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

from service.api.ask import Ask
from service.request.events import Done, Error, Event
from service.request.sequence import Sequence
from service.response_cache.cache import Ticket
from service.security.auth import Credential


class Sink(Protocol):
    """Where a flight's events go (see the module docstring)."""

    def __call__(self, event: Event, terminal: bool) -> None: ...


class Control(Protocol):
    """What a flight asks of the engine once it is submitted (``Engine.abort`` / ``Engine.pause``)."""

    def abort(self, seq: Sequence, error: Error | None = None) -> None: ...
    def pause(self, seq: Sequence, paused: bool) -> None: ...


class Observer(Protocol):
    """What the lifecycle tells telemetry (``service.observability.telemetry.Telemetry``)."""

    def on_submit(self, seq: Sequence) -> None:
        """``seq`` was submitted (or answered by the response cache, which counts as a request that ran)."""

    def cache_hit(self, seq: Sequence, hit: bool) -> None:
        """The response cache answered ``seq`` (``hit``) or let it run and store its answer."""

    def on_finish(self, seq: Sequence, event: Done | Error) -> None:
        """``seq`` ended with ``event``."""


@dataclass(eq=False)
class Flight:
    """One request in the lifecycle (see the module docstring); ``Intake.open`` makes it."""

    ask: Ask
    sink: Sink
    control: Control
    credential: Credential | None  # what authenticated the call: checked again while it streams
    tenant: str  # whose request it is: quotas, fair share, cache scope
    after: Flight | None = None  # admitted only after this flight (None once it was)
    # NOTE: the request's arrival, not the end of its preparation (the scheduler orders by it)
    arrival: float = field(default_factory=time.monotonic)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # submitted or ended: the stream's next may go
    seqs: tuple[Sequence, ...] = ()  # the submitted choices (empty before submission)
    left: int = 0  # choices whose terminal event has not come yet
    ticket: Ticket | None = None  # the response cache's, when the request leads or stores
    refused: Error | None = None  # the engine or a quota refused the submission
    ended: bool = False
    paused: bool = False
    checked_at: float = 0.0  # when the credential was last checked (monotonic)
    cancelled: bool = False
    cancel_error: Error | None = None  # a cancel's own error (None: a plain cancel, CANCELLED)

    @property
    def request_id(self) -> str:
        return self.ask.request_id

    def cancel(self, error: Error | None = None) -> None:
        """Cancel the request wherever it is (``error``: end it with this error instead of CANCELLED)."""
        if self.ended:
            return
        if not self.cancelled:
            self.cancelled, self.cancel_error = True, error
        for seq in self.seqs:
            self.control.abort(seq, error)

    def pause(self, paused: bool) -> None:
        """Stop (or resume) scheduling the request's choices while its client does not read."""
        self.paused = paused
        for seq in self.seqs:
            self.control.pause(seq, paused)
