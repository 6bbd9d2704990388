"""Sync Generate streams: many requests multiplexed on one bidirectional RPC.

:class:`GenerateStream` is the multiplexed stream (submit, cancel, iterate
``(request_id, event)`` pairs); ``generation.Generation`` is the view of a
single request on its own stream.

Threading: ``submit``, ``cancel`` and ``close`` may be called from any thread,
including from inside the iteration loop; a stream is iterated at most once.
While it is iterated, one reader thread per Generate call (``_legs.py``) feeds a
small bounded queue, so a caller that stops iterating stops the reading too.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
import weakref
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb

from ._legs import END, IDLE_ACK_S, CallSet, Outbox
from ._mux import ACKS_METADATA, Leg, MuxState
from .errors import InferenceError
from .events import ErrorEvent, Result, StreamEvent
from .retry import Deadline, RetryPolicy
from .spec import RequestSpec


def new_request_id() -> str:
    """A fresh, practically unique request id."""
    return uuid.uuid4().hex[:16]


class StreamRegistry:
    """Which stream owns which in-flight request id (for ``client.cancel(request_id)``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def add(self, request_id: str, stream: Any) -> None:
        with self._lock:
            self._owners[request_id] = stream

    def discard(self, request_id: str, stream: Any) -> None:
        with self._lock:
            if self._owners.get(request_id) is stream:
                del self._owners[request_id]

    def owner(self, request_id: str) -> Any | None:
        with self._lock:
            return self._owners.get(request_id)


class GenerateStream:
    """One Generate RPC carrying many requests; iterate it for ``(request_id, event)``.

    Events of different requests interleave. Each request ends with ``Done`` or
    ``ErrorEvent`` (a per-request failure; the stream goes on). After
    :meth:`close`, the stream half-closes once every request finished and the
    iteration ends. A failure of the whole stream raises ``InferenceError``
    from the iteration. Leaving the iteration early cancels the RPC.

    A request that a replica going away (draining, failed engine) ended before
    any of its tokens is sent again on a new Generate call, which the channel
    places on another replica; the caller sees only its final outcome.
    """

    def __init__(
        self,
        stub: Any,
        *,
        policy: RetryPolicy,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] | None = None,
        registry: StreamRegistry | None = None,
    ) -> None:
        self._stub = stub
        self._metadata = [*(metadata or ()), ACKS_METADATA]
        self._registry = registry
        self._lock = threading.RLock()
        self._state = MuxState(policy, Deadline(timeout))
        self._timers: set[threading.Timer] = set()
        self._finished = False
        self._iterated = False
        self.request_ids: list[str] = []
        self._calls = CallSet()
        self._open(self._state.current)

    def _open(self, leg: Leg) -> None:
        """Start (or restart) ``leg``'s Generate call, with the messages sent on it so far."""
        timeout = self._state.deadline.check(leg.attempts - 1)
        outbox = Outbox()
        for msg in leg.log:
            outbox.put(msg)
        call = self._stub.Generate(outbox, timeout=timeout, metadata=self._metadata)
        self._calls.add(leg, call, outbox)
        self._maybe_half_close(leg)

    def submit(self, spec: RequestSpec | str) -> str:
        """Send a new request (a spec or a bare prompt); return its request id."""
        if isinstance(spec, str):
            spec = RequestSpec(prompt=spec)
        request_id = spec.request_id or new_request_id()
        msg = spec.to_proto(request_id)
        with self._lock:
            if self._finished:
                raise ValueError("the stream has finished")
            self._state.register(msg)
            self._calls.send(self._state.current, msg)
            self.request_ids.append(request_id)
        if self._registry is not None:
            self._registry.add(request_id, self)
        return request_id

    def cancel(self, request_id: str) -> bool:
        """Ask the server to cancel ``request_id``; False if it is not in flight here.

        The request then ends with ``Done(finish_reason="cancelled")`` (or with
        its normal end, if that was already on its way).
        """
        with self._lock:
            found = self._state.cancel(request_id)
            if found is not None and not self._finished:
                self._calls.send(*found)
            return request_id in self._state.entries

    def close(self) -> None:
        """No more submissions; the stream ends once the in-flight requests finished."""
        with self._lock:
            self._state.closed = True
            self._maybe_half_close(self._state.current)

    def abort(self) -> None:
        """Cancel the RPC now; in-flight requests are cancelled by the server."""
        self._shutdown()

    def in_flight(self) -> list[str]:
        """Ids of the requests that have not finished yet."""
        with self._lock:
            return self._state.unfinished()

    def __iter__(self) -> Generator[tuple[str, StreamEvent], None, None]:
        if self._iterated:
            raise RuntimeError("a GenerateStream can be iterated only once")
        self._iterated = True
        return self._events()

    def _events(self) -> Generator[tuple[str, StreamEvent], None, None]:
        try:
            self._calls.start_readers()
            while self._calls:
                leg, item = self._next()
                if item is END or isinstance(item, grpc.RpcError):
                    yield from self._leg_ended(leg, item)
                else:
                    yield from self._deliver(leg, item)
        finally:
            self._shutdown()

    def _next(self) -> tuple[Leg, Any]:
        """The next item of any call; after IDLE_ACK_S without one, acknowledge what was read first."""
        try:
            return self._calls.inbox.get(timeout=IDLE_ACK_S)
        except queue.Empty:
            with self._lock:
                for leg in list(self._state.legs):
                    if (ack := leg.ack_due(idle=True)) is not None:
                        self._calls.send(leg, ack)
            return self._calls.inbox.get()

    def _deliver(self, leg: Leg, resp: pb.GenerateResponse) -> list[tuple[str, StreamEvent]]:
        with self._lock:
            outcome = self._state.on_response(leg, resp)
            if (ack := leg.ack_due()) is not None:
                self._calls.send(leg, ack)
            if outcome is None:
                return []
            if outcome.retry_after is not None:
                self._schedule_resend(outcome.request_id, outcome.retry_after)
            if outcome.move:
                self._send_moved()
            if outcome.terminal and self._registry is not None:
                self._registry.discard(outcome.request_id, self)
            self._maybe_half_close(leg)
        return [] if outcome.event is None else [(outcome.request_id, outcome.event)]

    def _send_moved(self) -> None:
        """Send the moved requests on the current leg, opening its call first if it has none."""
        leg = self._state.current
        msgs = self._state.take_moved()
        if leg in self._calls:
            for msg in msgs:
                self._calls.send(leg, msg)
        else:
            self._open(leg)  # its log holds the moved messages
            self._calls.start_reader(leg)

    def _leg_ended(self, leg: Leg, item: Any) -> Iterator[tuple[str, StreamEvent]]:
        """A call ended: re-open it (failed before any response), or end its unfinished requests."""
        exc = item if isinstance(item, grpc.RpcError) else None
        with self._lock:
            self._calls.discard(leg)
            wait = self._state.on_leg_error(leg, exc) if exc is not None else None
        if wait is not None:
            time.sleep(wait)
            with self._lock:
                self._open(leg)
                self._calls.start_reader(leg)
            return
        with self._lock:
            current = leg is self._state.current
            lost = self._state.end_leg(leg)
        if exc is not None and current:
            raise InferenceError.from_rpc_error(exc, attempts=leg.attempts) from None
        yield from self._orphans(lost, exc)

    def _orphans(self, ids: list[str], exc: grpc.RpcError | None) -> Iterator[tuple[str, StreamEvent]]:
        """Requests whose call ended before they finished."""
        for request_id in ids:
            if exc is not None:
                err = InferenceError.from_rpc_error(exc)
                err.request_id = request_id
            else:
                err = InferenceError(
                    grpc.StatusCode.INTERNAL, "stream ended before the request finished", request_id=request_id
                )
            if self._registry is not None:
                self._registry.discard(request_id, self)
            yield request_id, ErrorEvent(err)

    def _schedule_resend(self, request_id: str, wait: float) -> None:
        timer = threading.Timer(wait, self._resend, args=(request_id,))
        timer.daemon = True
        self._timers.add(timer)
        timer.start()

    def _resend(self, request_id: str) -> None:
        with self._lock:
            self._timers = {t for t in self._timers if t.is_alive() and t is not threading.current_thread()}
            if self._finished:
                return
            leg, msgs = self._state.resend(request_id)
            for msg in msgs:
                self._calls.send(leg, msg)

    def _maybe_half_close(self, leg: Leg) -> None:
        if leg in self._calls and self._state.should_half_close(leg):
            self._calls.half_close(leg)

    def _shutdown(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            for timer in self._timers:
                timer.cancel()
            ids = list(self._state.entries)
        self._calls.cancel_all()  # no-op for calls that already ended
        if self._registry is not None:
            for request_id in ids:
                self._registry.discard(request_id, self)

    def collect(self) -> dict[str, Result]:
        """Iterate to the end; return each request's :class:`Result`, in submission order."""
        results: dict[str, Result] = {rid: Result(rid) for rid in self.request_ids}
        for request_id, event in self:
            results.setdefault(request_id, Result(request_id)).add(event)
        return results

    def __del__(self) -> None:
        # An abandoned, never-iterated stream: release gRPC's request-consumer threads.
        calls = getattr(self, "_calls", None)
        if calls is not None:
            calls.close_outboxes()

    def __enter__(self) -> GenerateStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._shutdown()
