"""I/O-free bookkeeping of one multiplexed Generate stream.

Shared by the sync (``stream.py``) and asyncio (``aio.py``) streams, which do
the sending, receiving and sleeping. Callers serialize access (a lock).

Retry rules implemented here:

* a stream that fails before any response arrived is re-opened and every
  message sent so far is replayed (``on_stream_error`` + ``replay``);
* a request whose ``error`` event has a retryable code, arrives before any of
  its deltas and was not cancelled is re-sent on the same stream after a
  backoff (``on_response`` returns the wait, ``resend`` the messages).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from inference.v1 import inference_pb2 as pb

from .events import Delta, Done, ErrorEvent, StreamEvent, event_from_proto
from .retry import Deadline, RetryPolicy, retry_delay
from .spec import cancel_request


@dataclass
class _Entry:
    message: pb.GenerateRequest
    attempts: int = 1
    started: bool = False
    cancel_requested: bool = False
    retry_pending: bool = False
    choices_left: int = 1  # Done events still due (SamplingParams.n)


@dataclass(frozen=True)
class Outcome:
    """What to do with one response: deliver ``event`` and/or re-send after ``retry_after`` s."""

    request_id: str
    event: StreamEvent | None = None
    retry_after: float | None = None
    last: bool = True  # False for the Done of a choice when other choices go on

    @property
    def terminal(self) -> bool:
        """True when the event ends its request."""
        return isinstance(self.event, Done | ErrorEvent) and self.last


class MuxState:
    """In-flight requests of one stream and the retry decisions about them."""

    def __init__(self, policy: RetryPolicy, deadline: Deadline) -> None:
        self.policy = policy
        self.deadline = deadline
        self.entries: dict[str, _Entry] = {}
        self.log: list[pb.GenerateRequest] = []  # messages sent before the first response
        self.any_response = False
        self.closed = False  # no more submissions
        self.half_closed = False
        self.stream_attempts = 1

    def register(self, msg: pb.GenerateRequest) -> None:
        """Track a new request; ``ValueError`` if its id is already in flight or the stream is closed."""
        if self.closed:
            raise ValueError("the stream is closed for new requests")
        if msg.request_id in self.entries:
            raise ValueError(f"request_id {msg.request_id!r} is already in flight on this stream")
        n = msg.sampling.n if msg.sampling.HasField("n") and msg.sampling.n > 1 else 1
        self.entries[msg.request_id] = _Entry(msg, choices_left=n)
        self.record(msg)

    def record(self, msg: pb.GenerateRequest) -> None:
        """Note a sent message, for replay should the stream fail before any response."""
        if not self.any_response:
            self.log.append(msg)

    def cancel(self, request_id: str) -> pb.GenerateRequest | None:
        """The cancel message to send, or None if the request is not in flight (or already cancelled).

        A request waiting for a retry is cancelled when its re-send happens (see ``resend``).
        """
        entry = self.entries.get(request_id)
        if entry is None or entry.cancel_requested:
            return None
        entry.cancel_requested = True
        if entry.retry_pending:
            return None
        msg = cancel_request(request_id)
        self.record(msg)
        return msg

    def on_response(self, resp: pb.GenerateResponse) -> Outcome | None:
        """Account for one response; None when it is to be dropped (unknown or finished request)."""
        self.any_response = True
        self.log.clear()
        event = event_from_proto(resp)
        entry = self.entries.get(resp.request_id)
        if event is None or entry is None or entry.retry_pending:
            return None
        if isinstance(event, Delta):
            entry.started = True
            return Outcome(resp.request_id, event)
        if isinstance(event, ErrorEvent):
            wait = self._request_retry_wait(entry, event)
            if wait is not None:
                entry.attempts += 1
                entry.retry_pending = True
                return Outcome(resp.request_id, retry_after=wait)
            event.error.attempts = entry.attempts
        elif isinstance(event, Done) and entry.choices_left > 1:
            entry.choices_left -= 1  # one choice ended; the request goes on
            return Outcome(resp.request_id, event, last=False)
        del self.entries[resp.request_id]
        return Outcome(resp.request_id, event)

    def _request_retry_wait(self, entry: _Entry, event: ErrorEvent) -> float | None:
        if entry.started or entry.cancel_requested:
            return None
        err = event.error
        wait = self.policy.delay(err.code, entry.attempts, err.retry_after)
        if wait is None or not self.deadline.allows(wait):
            return None
        return wait

    def resend(self, request_id: str) -> list[pb.GenerateRequest]:
        """Messages to send when a request's retry wait is over (empty if it went away)."""
        entry = self.entries.get(request_id)
        if entry is None or not entry.retry_pending:
            return []
        entry.retry_pending = False
        msgs = [entry.message]
        if entry.cancel_requested:
            msgs.append(cancel_request(request_id))
        for msg in msgs:
            self.record(msg)
        return msgs

    def on_stream_error(self, exc: grpc.RpcError) -> float | None:
        """Seconds to wait before re-opening the failed stream, or None to give up."""
        if self.any_response:
            return None
        wait = retry_delay(exc, self.policy, self.stream_attempts, self.deadline)
        if wait is not None:
            self.stream_attempts += 1
        return wait

    def replay(self) -> list[pb.GenerateRequest]:
        """Messages to send on a (re-)opened stream: everything sent before any response."""
        self.half_closed = False
        return list(self.log)

    def should_half_close(self) -> bool:
        """True once (per opened stream) when closed for submissions and nothing is in flight."""
        if self.closed and not self.entries and not self.half_closed:
            self.half_closed = True
            return True
        return False

    def unfinished(self) -> list[str]:
        """Ids of requests still in flight."""
        return list(self.entries)
