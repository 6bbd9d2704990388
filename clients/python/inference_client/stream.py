"""Sync Generate streams: many requests multiplexed on one bidirectional RPC.

:class:`GenerateStream` is the multiplexed stream (submit, cancel, iterate
``(request_id, event)`` pairs); ``generation.Generation`` is the view of a
single request on its own stream.

Threading: ``submit``, ``cancel`` and ``close`` may be called from any thread,
including from inside the iteration loop; a stream is iterated at most once.
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

from ._mux import MuxState
from .errors import InferenceError
from .events import ErrorEvent, Result, StreamEvent
from .retry import Deadline, RetryPolicy
from .spec import RequestSpec

_END = object()


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


class _Outbox:
    """The request iterator handed to gRPC: blocks for messages until closed."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, msg: pb.GenerateRequest) -> None:
        self._queue.put(msg)

    def close(self) -> None:
        self._queue.put(_END)

    def __iter__(self) -> Iterator[pb.GenerateRequest]:
        return self

    def __next__(self) -> pb.GenerateRequest:
        item = self._queue.get()
        if item is _END:
            raise StopIteration
        return item


class GenerateStream:
    """One Generate RPC carrying many requests; iterate it for ``(request_id, event)``.

    Events of different requests interleave. Each request ends with ``Done`` or
    ``ErrorEvent`` (a per-request failure; the stream goes on). After
    :meth:`close`, the stream half-closes once every request finished and the
    iteration ends. A failure of the whole stream raises ``InferenceError``
    from the iteration. Leaving the iteration early cancels the RPC.
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
        self._metadata = metadata
        self._registry = registry
        self._lock = threading.RLock()
        self._state = MuxState(policy, Deadline(timeout))
        self._timers: set[threading.Timer] = set()
        self._finished = False
        self._iterated = False
        self.request_ids: list[str] = []
        self._outbox = _Outbox()
        self._call = self._open_call()

    def _open_call(self) -> Any:
        timeout = self._state.deadline.check(self._state.stream_attempts - 1)
        return self._stub.Generate(self._outbox, timeout=timeout, metadata=self._metadata)

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
            self._outbox.put(msg)
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
            msg = self._state.cancel(request_id)
            if msg is not None and not self._finished:
                self._outbox.put(msg)
            return request_id in self._state.entries

    def close(self) -> None:
        """No more submissions; the stream ends once the in-flight requests finished."""
        with self._lock:
            self._state.closed = True
            self._maybe_half_close()

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
            while True:
                try:
                    for resp in self._call:
                        yield from self._deliver(resp)
                    break
                except grpc.RpcError as exc:
                    if not self._reopen(exc):
                        attempts = self._state.stream_attempts
                        raise InferenceError.from_rpc_error(exc, attempts=attempts) from None
            yield from self._orphans()
        finally:
            self._shutdown()

    def _deliver(self, resp: pb.GenerateResponse) -> list[tuple[str, StreamEvent]]:
        with self._lock:
            outcome = self._state.on_response(resp)
            if outcome is None:
                return []
            if outcome.retry_after is not None:
                self._schedule_resend(outcome.request_id, outcome.retry_after)
            if outcome.terminal and self._registry is not None:
                self._registry.discard(outcome.request_id, self)
            self._maybe_half_close()
        return [] if outcome.event is None else [(outcome.request_id, outcome.event)]

    def _orphans(self) -> Iterator[tuple[str, StreamEvent]]:
        """Requests the server never finished before ending the stream."""
        with self._lock:
            ids = self._state.unfinished()
            self._state.entries.clear()
        for request_id in ids:
            err = InferenceError(
                grpc.StatusCode.INTERNAL, "stream ended before the request finished", request_id=request_id
            )
            yield request_id, ErrorEvent(err)

    def _reopen(self, exc: grpc.RpcError) -> bool:
        with self._lock:
            wait = self._state.on_stream_error(exc)
        if wait is None:
            return False
        time.sleep(wait)
        with self._lock:
            self._outbox.close()
            self._outbox = _Outbox()
            self._call = self._open_call()
            for msg in self._state.replay():
                self._outbox.put(msg)
            self._maybe_half_close()
        return True

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
            for msg in self._state.resend(request_id):
                self._outbox.put(msg)

    def _maybe_half_close(self) -> None:
        if self._state.should_half_close():
            self._outbox.close()

    def _shutdown(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            for timer in self._timers:
                timer.cancel()
            self._outbox.close()
            ids = list(self._state.entries)
        self._call.cancel()  # no-op when the RPC already ended
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
        # An abandoned, never-iterated stream: release gRPC's request-consumer thread.
        outbox = getattr(self, "_outbox", None)
        if outbox is not None:
            outbox.close()

    def __enter__(self) -> GenerateStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._shutdown()
