"""I/O-free bookkeeping of one multiplexed Generate stream.

Shared by the sync (``stream.py``) and asyncio (``aio_stream.py``) streams, which do
the sending, receiving and sleeping. Callers serialize access (a lock).

A stream is carried by one or more **legs** (Generate calls): the first one, and a
new one when a replica goes away. Retry rules implemented here:

* a leg that fails before any response arrived is re-opened and every message
  sent on it is replayed (``on_leg_error`` + ``Leg.log``);
* a request whose ``error`` event has a retryable code, arrives before any of
  its deltas and was not cancelled is re-sent on the same leg after a backoff
  (``on_response`` returns the wait, ``resend`` the messages);
* a request that a replica going away ended (``reason`` "draining" or
  "engine_failed", see ``errors.ELSEWHERE_REASONS``) before any of its deltas
  **moves**: it is sent again on a new leg, which the channel places on another
  replica (``on_response`` makes that leg current and says ``move``;
  ``take_moved`` gives the messages); the old leg is half-closed once its other
  requests ended.

Flow control: the client offers acknowledgements in each call's metadata; when
the server accepts them (in its initial metadata: ``Leg.acks``), the caller
counts the responses it has read per leg (``Leg.read``) and ``Leg.ack_due`` says
when to send ``GenerateRequest.ack`` (the server measures the stream's backlog
by it, see the proto). A server that does not accept them never gets one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from inference.v1 import inference_pb2 as pb

from .events import Delta, Done, ErrorEvent, StreamEvent, event_from_proto
from .retry import Deadline, RetryPolicy, retry_delay
from .spec import cancel_request

ACK_EVERY = 16  # acknowledge at least every this many messages read (the protocol's promise)
ACKS_METADATA = ("inference-stream-acks", "1")  # offered in the call's metadata, accepted in the server's


def accepts_acks(initial_metadata: object) -> bool:
    """Did the server accept acknowledgements (its initial metadata echoes ``ACKS_METADATA``)?"""
    for key, value in initial_metadata or ():  # type: ignore[attr-defined]
        if key == ACKS_METADATA[0]:
            return value in ("1", b"1")
    return False


@dataclass(eq=False)
class Leg:
    """One Generate call of the stream."""

    log: list[pb.GenerateRequest] = field(default_factory=list)  # sent before its first response
    any_response: bool = False
    half_closed: bool = False
    attempts: int = 1  # times this leg was opened
    read: int = 0  # responses the caller has read from it
    acked: int = 0  # the count last acknowledged
    acks: bool = False  # the server accepted acknowledgements on this call (its initial metadata)

    def record(self, msg: pb.GenerateRequest) -> None:
        """Note a sent message, for replay should the leg fail before any response."""
        if not self.any_response:
            self.log.append(msg)

    def ack_due(self, idle: bool = False) -> pb.GenerateRequest | None:
        """The ack to send now: every ACK_EVERY messages read, or when ``idle`` (all read) and any is unacked."""
        unacked = self.read - self.acked
        if not self.acks or self.half_closed or unacked <= 0 or (unacked < ACK_EVERY and not idle):
            return None
        self.acked = self.read
        return pb.GenerateRequest(ack=self.read)


@dataclass(eq=False)
class _Entry:
    message: pb.GenerateRequest
    leg: Leg
    attempts: int = 1
    started: bool = False
    cancel_requested: bool = False
    retry_pending: bool = False
    moved: bool = False  # to be sent on a new leg (its replica goes away)
    choices_left: int = 1  # Done events still due (SamplingParams.n)


@dataclass(frozen=True)
class Outcome:
    """What to do with one response: deliver ``event``, re-send after ``retry_after`` s, or ``move``."""

    request_id: str
    event: StreamEvent | None = None
    retry_after: float | None = None
    move: bool = False  # send ``take_moved()`` on the current leg (opening its call if it has none)
    last: bool = True  # False for the Done of a choice when other choices go on

    @property
    def terminal(self) -> bool:
        """True when the event ends its request."""
        return isinstance(self.event, Done | ErrorEvent) and self.last


class MuxState:
    """In-flight requests of one stream, its legs, and the retry decisions about them."""

    def __init__(self, policy: RetryPolicy, deadline: Deadline) -> None:
        self.policy = policy
        self.deadline = deadline
        self.entries: dict[str, _Entry] = {}
        self.current = Leg()  # where new requests go
        self.legs: list[Leg] = [self.current]  # legs whose call has not ended
        self.closed = False  # no more submissions

    @property
    def stream_attempts(self) -> int:
        return self.current.attempts

    def register(self, msg: pb.GenerateRequest) -> None:
        """Track a new request; ``ValueError`` if its id is already in flight or the stream is closed."""
        if self.closed:
            raise ValueError("the stream is closed for new requests")
        if msg.request_id in self.entries:
            raise ValueError(f"request_id {msg.request_id!r} is already in flight on this stream")
        n = msg.sampling.n if msg.sampling.HasField("n") and msg.sampling.n > 1 else 1
        self.entries[msg.request_id] = _Entry(msg, self.current, choices_left=n)
        self.current.record(msg)

    def cancel(self, request_id: str) -> tuple[Leg, pb.GenerateRequest] | None:
        """The cancel message and the leg to send it on, or None (not in flight, or already cancelled).

        A request waiting for a retry or a move is cancelled when it is sent again.
        """
        entry = self.entries.get(request_id)
        if entry is None or entry.cancel_requested:
            return None
        entry.cancel_requested = True
        if entry.retry_pending or entry.moved:
            return None
        msg = cancel_request(request_id)
        entry.leg.record(msg)
        return entry.leg, msg

    def on_response(self, leg: Leg, resp: pb.GenerateResponse) -> Outcome | None:
        """Account for one response of ``leg``; None when it is to be dropped (unknown or finished request)."""
        leg.any_response = True
        leg.log.clear()
        leg.read += 1
        event = event_from_proto(resp)
        entry = self.entries.get(resp.request_id)
        if event is None or entry is None or entry.retry_pending or entry.moved or entry.leg is not leg:
            return None
        if isinstance(event, Delta):
            entry.started = True
            return Outcome(resp.request_id, event)
        if isinstance(event, ErrorEvent):
            return self._on_error(entry, event)
        if isinstance(event, Done) and entry.choices_left > 1:
            entry.choices_left -= 1  # one choice ended; the request goes on
            return Outcome(resp.request_id, event, last=False)
        del self.entries[resp.request_id]
        return Outcome(resp.request_id, event)

    def _on_error(self, entry: _Entry, event: ErrorEvent) -> Outcome:
        rid = entry.message.request_id
        err = event.error
        if not entry.started and not entry.cancel_requested:
            move = err.elsewhere
            # NOTE: a replica going away hints when to ask *it* again; the move goes elsewhere
            wait = self.policy.delay(err.code, entry.attempts, None if move else err.retry_after)
            if wait is not None and self.deadline.allows(wait):
                entry.attempts += 1
                if move:
                    entry.moved = True
                    if entry.leg is self.current:
                        self.new_leg()
                    return Outcome(rid, move=True)
                entry.retry_pending = True
                return Outcome(rid, retry_after=wait)
        err.attempts = entry.attempts
        del self.entries[rid]
        return Outcome(rid, event)

    def new_leg(self) -> Leg:
        """A new current leg (the old one takes no new requests and half-closes once idle)."""
        self.current = Leg()
        self.legs.append(self.current)
        return self.current

    def take_moved(self) -> list[pb.GenerateRequest]:
        """Messages of the moved requests, now on the current leg (a cancel follows a cancelled one)."""
        msgs: list[pb.GenerateRequest] = []
        for rid, entry in self.entries.items():
            if entry.moved:
                entry.moved, entry.leg = False, self.current
                msgs.append(entry.message)
                if entry.cancel_requested:
                    msgs.append(cancel_request(rid))
        for msg in msgs:
            self.current.record(msg)
        return msgs

    def resend(self, request_id: str) -> tuple[Leg, list[pb.GenerateRequest]]:
        """The leg and messages to send when a request's retry wait is over (none if it went away)."""
        entry = self.entries.get(request_id)
        if entry is None or not entry.retry_pending:
            return self.current, []
        entry.retry_pending = False
        msgs = [entry.message]
        if entry.cancel_requested:
            msgs.append(cancel_request(request_id))
        for msg in msgs:
            entry.leg.record(msg)
        return entry.leg, msgs

    def on_leg_error(self, leg: Leg, exc: grpc.RpcError) -> float | None:
        """Seconds to wait before re-opening the failed ``leg`` (replaying ``leg.log``), or None to give up."""
        if leg.any_response:
            return None
        wait = retry_delay(exc, self.policy, leg.attempts, self.deadline)
        if wait is not None:
            leg.attempts += 1
            leg.half_closed = False
        return wait

    def end_leg(self, leg: Leg) -> list[str]:
        """``leg``'s call ended for good: the ids of its requests that will never finish (forgotten)."""
        if leg in self.legs:
            self.legs.remove(leg)
        lost = [rid for rid, e in self.entries.items() if e.leg is leg and not e.moved]
        for rid in lost:
            del self.entries[rid]
        return lost

    def should_half_close(self, leg: Leg) -> bool:
        """True once per opening of ``leg``: it takes no new requests and none of its own is in flight."""
        if leg.half_closed or (leg is self.current and not self.closed):
            return False
        if any(e.leg is leg for e in self.entries.values()):
            return False
        leg.half_closed = True
        return True

    def unfinished(self) -> list[str]:
        """Ids of requests still in flight."""
        return list(self.entries)
