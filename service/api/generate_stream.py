"""One ``Generate`` stream: the gRPC translator over the lifecycle, many requests on one RPC.

Each request message becomes an ``Ask`` that runs through the lifecycle
(``Intake.start``) as a ``Flight``; its events come back as protos. The stream
itself owns only what is the stream's:

* request ids: every id sent gets exactly one terminal event (``done`` or
  ``error``), whatever races (cancel against completion, cancel during
  preparation, a failing preparation, an engine failure): the lifecycle
  guarantees one per flight, and messages refused before a flight exists
  (malformed, empty or duplicate ids) are answered here;
* the stream ends (the RPC completes) once the client has half-closed and every
  accepted request has had its terminal event;
* order: requests are prepared in parallel but admitted (cache, engine) in
  the order the client sent them;
* backpressure: past ``backlog_high`` messages the client has not read
  (``service.api.stream_backlog``) the stream's flights pause, at
  ``backlog_low`` they resume (a write pending ``write_pending_s`` pauses them
  too), and a stream paused for ``stall_timeout_s`` has its requests cancelled.

Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable

from inference.v1 import inference_pb2 as pb

from service.api.ask import Ask
from service.api.call_events import CallEvents
from service.api.flight import Flight, Sink
from service.api.intake import Intake
from service.api.proto_convert import error_proto, event_proto
from service.api.reasoning import ThoughtAsk, ThoughtEvents
from service.api.request_builder import MAX_REQUEST_ID_BYTES
from service.api.stream_backlog import Backlog, StreamLimits
from service.api.tolerant_decoding import MALFORMED
from service.request.events import Error, Event

log = logging.getLogger("service.rpc")

# Ids of finished requests remembered per stream, so a late cancel is ignored
# instead of answered with a second terminal event.
FINISHED_MEMORY = 4096


class GenerateStream:
    """In-flight requests and the outgoing queue of one Generate RPC."""

    def __init__(self, intake: Intake, deadline: float | None, limits: StreamLimits, acks: bool) -> None:
        self.intake = intake
        self.deadline = deadline  # the RPC's (service.api.readiness.rpc_deadline), for every request on it
        self.limits = limits
        self.out: asyncio.Queue[pb.GenerateResponse | None] = asyncio.Queue()
        self.active: dict[str, Flight] = {}
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.reading = True
        self.closed = False
        self.backlog = Backlog(limits, acks, self._set_paused, self._on_stall)
        self.last: Flight | None = None  # the request sent last (the next one is admitted after it)

    # -- reading the client's messages -----------------------------------------------------
    async def read(self, requests: AsyncIterator[pb.GenerateRequest]) -> None:
        try:
            async for req in requests:
                self.on_request(req)
        except Exception as exc:  # client went away mid-read
            log.debug("generate stream read ended: %s", exc)
        finally:
            self.reading = False
            self.backlog.client_closed()
            self._maybe_close()

    def on_request(self, req: pb.GenerateRequest) -> None:
        if req is MALFORMED:
            self._put_error("", "INVALID_ARGUMENT", "message is not a valid inference.v1.GenerateRequest")
            return
        if req.ack:  # flow control only (service.api.stream_backlog): the client has read this many
            self.backlog.on_ack(req.ack)
            return
        rid = req.request_id
        if len(rid.encode()) > MAX_REQUEST_ID_BYTES:
            self._put_error(rid[:64], "INVALID_ARGUMENT", f"request_id is longer than {MAX_REQUEST_ID_BYTES} bytes")
        elif req.cancel:
            self._cancel(rid)
        elif not rid:
            self._put_error(rid, "INVALID_ARGUMENT", "request_id is empty")
        elif rid in self.active:
            # NOTE: the in-flight request keeps its id and its own terminal event; this error
            # answers the second message (documented in the proto).
            self._put_error(rid, "INVALID_ARGUMENT", f"duplicate request_id {rid!r}: a request with it is in flight")
        else:
            self.finished.pop(rid, None)
            # NOTE: a reasoning model's chat is set up in preparation, its thought read apart here
            # (service.api.reasoning); in the order sent: a request is admitted after the stream's previous one
            ask = Ask.generate(req, self.deadline, reasons=True)
            calls = CallEvents(ask.calls) if ask.calls is not None else None
            self.last = self.intake.start(ask, self._sink(rid, calls, ask.thought), self.last)
            self.active[rid] = self.last
            if self.backlog.paused:
                self.active[rid].pause(True)

    def _sink(self, rid: str, calls: CallEvents | None, thought: ThoughtAsk | None) -> Sink:
        split = ThoughtEvents(thought) if thought is not None else None

        def sink(event: Event, terminal: bool) -> None:
            msgs = [event_proto(rid, event)]
            if split is not None:  # the thought first: calls are read from the answer alone
                msgs = [out for msg in msgs for out in split.events(msg)]
            if calls is not None:
                failed = calls.failed  # NOTE: a request that failed on its calls has had its terminal event
                msgs = [out for msg in msgs for out in calls.messages(msg)]
                if failed:
                    return
                if calls.failed and not terminal:  # its error is the terminal event: the rest is stopped
                    terminal = True
                    if (flight := self.active.get(rid)) is not None:
                        flight.cancel()
            for msg in msgs:
                self._put(msg)
            if terminal:
                self._ended(rid)

        return sink

    def _cancel(self, rid: str) -> None:
        if rid in self.finished:
            log.debug("cancel for finished request ignored")
        elif rid not in self.active:
            self._put_error(rid, "NOT_FOUND", f"cancel: no request {rid!r} in flight on this stream")
        else:
            self.active[rid].cancel()

    # -- output ------------------------------------------------------------------------------
    def _ended(self, rid: str) -> None:
        """A request's terminal event was queued."""
        self.active.pop(rid, None)
        self.finished[rid] = None
        while len(self.finished) > FINISHED_MEMORY:
            self.finished.popitem(last=False)
        self._maybe_close()

    def _put_error(self, rid: str, status: str, message: str) -> None:
        self._put(pb.GenerateResponse(request_id=rid, error=error_proto(status, message)))

    def _put(self, msg: pb.GenerateResponse) -> None:
        if self.closed:
            return
        self.out.put_nowait(msg)
        self.backlog.on_produced()

    def _maybe_close(self) -> None:
        if not self.reading and not self.active and not self.closed:
            self.closed = True
            self.out.put_nowait(None)

    # -- backpressure ----------------------------------------------------------------------------
    def on_write(self) -> None:
        """The RPC hands one message to the transport (``on_sent`` once the write completed)."""
        self.backlog.on_write()

    def on_sent(self) -> None:
        """The RPC wrote one message to the transport."""
        self.backlog.on_sent()

    def _set_paused(self, paused: bool) -> None:
        for flight in self._flights():
            flight.pause(paused)

    def _on_stall(self) -> None:
        """The client has not read for ``stall_timeout_s``: cancel its requests."""
        log.warning("a Generate stream was not read for %.0f s; cancelling its requests", self.limits.stall_timeout_s)
        message = f"cancelled: the client did not read its stream for {self.limits.stall_timeout_s:g} s"
        for flight in self._flights():
            flight.cancel(Error("CANCELLED", message))

    def abort_all(self) -> None:
        """The RPC ended (client closed, deadline, error): cancel what is still running."""
        self.closed = True
        self.backlog.close()
        for flight in self._flights():
            flight.cancel()
        self.active.clear()

    def _flights(self) -> Iterable[Flight]:
        return list(self.active.values())
