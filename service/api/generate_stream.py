"""One ``Generate`` stream: its in-flight requests, its outgoing queue and its backpressure.

Contract (every path below is tested):

* every request id sent on the stream gets exactly one terminal event (``done``
  or ``error``), whatever races: cancel against completion, cancel during
  preparation, a failing preparation, an engine failure;
* the stream ends (the RPC completes) once the client has half-closed and every
  accepted request has had its terminal event;
* an unread stream does not grow without bound: past ``backlog_high`` messages
  the client has not read (``service.api.stream_backlog``: acknowledged by the
  client when it acknowledges, else taken by the transport) its sequences are
  paused (not scheduled; the engine may preempt them), at ``backlog_low`` they
  resume, and a stream that stays paused for ``stall_timeout_s`` has its
  requests cancelled;
* a stream does not outlive its credentials: each new request checks them
  again against the tenants file in force (``Tenancy.recheck``), and so does a
  delta at most once a second; once revoked, new and in-flight requests end
  with UNAUTHENTICATED.

Event-loop only: the engine's events arrive here through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.intake import Intake, Need, rejection, rpc_deadline
from service.api.proto_convert import delta_proto, done_proto, error_proto, response_format
from service.api.request_builder import MAX_REQUEST_ID_BYTES
from service.api.stream_backlog import Backlog, StreamLimits, acknowledges
from service.api.tolerant_decoding import MALFORMED
from service.continuous_batcher import Draining
from service.priority import QueueFull
from service.request.choices import members
from service.request.errors import BadRequest
from service.request.events import Delta, Done, Error
from service.request.sequence import Sequence
from service.security.auth import current_credential

log = logging.getLogger("service.rpc")

# Ids of finished requests remembered per stream, so a late cancel is ignored
# instead of answered with a second terminal event.
FINISHED_MEMORY = 4096
RECHECK_S = 1.0  # in-flight requests see a revoked credential within this long (plus the file check)


class GenerateStream:
    """In-flight requests and the outgoing queue of one Generate RPC."""

    def __init__(self, intake: Intake, context: Any, limits: StreamLimits) -> None:
        self.intake = intake
        self.context = context
        self.limits = limits
        self.out: asyncio.Queue[pb.GenerateResponse | None] = asyncio.Queue()
        self.active: dict[str, Sequence | None] = {}  # choice 0; None while the request is being prepared
        self.remaining: dict[str, int] = {}  # choices of a request not ended yet (n > 1)
        self.cancelled: set[str] = set()  # cancelled while being prepared
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.reading = True
        self.closed = False
        acks = acknowledges(context.invocation_metadata())
        self.backlog = Backlog(limits, acks, self._set_paused, self._on_stall)
        self.tasks: set[asyncio.Task[None]] = set()
        self.credential = current_credential()  # set by the auth interceptor for this RPC
        self._checked = time.monotonic()

    # -- reading the client's messages -----------------------------------------------------
    async def read(self, requests: AsyncIterator[Any]) -> None:
        try:
            async for req in requests:
                self.on_request(req)
        except Exception as exc:  # client went away mid-read
            log.debug("generate stream read ended: %s", exc)
        finally:
            self.reading = False
            self.backlog.client_closed()
            self._maybe_close()

    def on_request(self, req: Any) -> None:
        if req is MALFORMED:
            self._put_error("", "INVALID_ARGUMENT", "message is not a valid inference.v1.GenerateRequest")
            return
        if req.ack:  # flow control only (service.api.stream_backlog): the client has read this many
            self.backlog.on_ack(req.ack)
            return
        rid = req.request_id
        if len(rid.encode()) > MAX_REQUEST_ID_BYTES:
            self._put_error(
                rid[:64], "INVALID_ARGUMENT", f"request_id is longer than {MAX_REQUEST_ID_BYTES} bytes"
            )
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
            self.active[rid] = None
            task = asyncio.create_task(self._start(req))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _start(self, req: pb.GenerateRequest) -> None:
        rid = req.request_id
        if (denial := self.intake.tenancy.recheck(self.credential)) is not None:
            self._end(rid, error=error_proto(denial[0].name, denial[1]))
            return
        if (why := self.intake.unavailable(Need.WORK)) is not None:
            # NOTE: the drain rule (service.api.intake) comes before any preparation: a draining
            # server answers a new request UNAVAILABLE whatever it holds, as it does a new RPC.
            self._end(rid, error=error_proto("UNAVAILABLE", why.message, 1000, reason=why.reason))
            return
        try:
            seqs = await self.intake.prepare_choices(
                rid,
                req.prompt,
                req.messages,
                req.sampling,
                req.priority,
                response_format(req.response_format) if req.HasField("response_format") else None,
                rpc_deadline(self.context),
            )
        except BadRequest as exc:
            self._end(rid, error=error_proto(exc.status, str(exc)))
            return
        except Exception as exc:  # a bug or an environment failure: this request only
            log.exception("preparing request failed")
            self._end(rid, error=error_proto("INTERNAL", f"preparing the request failed: {type(exc).__name__}"))
            return
        if rid in self.cancelled:  # cancelled while being prepared
            self._end(rid, done=pb.Done(finish_reason=pb.FINISH_REASON_CANCELLED))
            return
        replay = await self.intake.cache.before_submit(seqs[0], req, gave_up=lambda: rid in self.cancelled)
        if replay is not None:  # answered by the response cache (service.response_cache): no engine work
            for delta in replay.deltas:
                self._put(pb.GenerateResponse(request_id=rid, delta=delta))
            self._end(rid, done=replay.done, error=error_proto(*replay.error) if replay.error else None)
            return
        submitted: list[Sequence] = []
        try:
            for seq in seqs:
                seq.emit = functools.partial(self.on_event, seq)
                self.intake.submit(seq)
                submitted.append(seq)
        except (QueueFull, Draining) as exc:
            for seq in submitted:  # their CANCELLED events find the request ended and are dropped
                self.intake.abort(seq)
            r = rejection(exc)
            self._end(rid, error=error_proto(r.status, r.message, r.retry_after_ms, r.quota, r.reason))
            return
        self.active[rid] = seqs[0]
        if len(seqs) > 1:
            self.remaining[rid] = len(seqs)
        for seq in seqs if self.backlog.paused else ():
            self.intake.pause(seq, True)

    # -- engine events -----------------------------------------------------------------------
    def on_event(self, seq: Sequence, ev: Any) -> None:
        rid = seq.request_id
        lead = self.active.get(rid)
        if lead is None or seq not in members(lead):
            return  # the request already ended (an Error of another choice, or a failed submit)
        if isinstance(ev, Delta):
            self._put(pb.GenerateResponse(request_id=rid, delta=delta_proto(ev)))
            self._recheck_credentials()
            return
        self.intake.finished(seq, ev)
        if isinstance(ev, Done):
            left = self.remaining.get(rid, 1) - 1
            if left > 0:  # a choice ended; the request goes on
                self.remaining[rid] = left
                self._put(pb.GenerateResponse(request_id=rid, done=done_proto(ev)))
            else:
                self._end(rid, done=done_proto(ev))
        elif isinstance(ev, Error):
            for other in members(lead):  # one Error ends the whole request
                if other is not seq:
                    self.intake.abort(other)
            self._end(rid, error=error_proto(ev.status, ev.message, reason=ev.reason))

    def _recheck_credentials(self) -> None:
        """At most every RECHECK_S: if the stream's credentials were revoked, end its requests UNAUTHENTICATED."""
        now = time.monotonic()
        if now - self._checked < RECHECK_S:
            return
        self._checked = now
        if (denial := self.intake.tenancy.recheck(self.credential)) is not None:
            log.info("credentials of a Generate stream revoked; ending its requests")
            for seq in self._all_choices():
                self.intake.abort(seq, Error(denial[0].name, denial[1]))

    def _cancel(self, rid: str) -> None:
        if rid in self.finished:
            log.debug("cancel for finished request ignored")
            return
        if rid not in self.active:
            self._put_error(rid, "NOT_FOUND", f"cancel: no request {rid!r} in flight on this stream")
            return
        seq = self.active[rid]
        if seq is None:
            self.cancelled.add(rid)
        else:
            for choice in members(seq):
                self.intake.abort(choice)

    # -- output ------------------------------------------------------------------------------
    def _end(self, rid: str, *, done: pb.Done | None = None, error: pb.Error | None = None) -> None:
        """The one place a request's terminal event is queued."""
        self.active.pop(rid, None)
        self.remaining.pop(rid, None)
        self.cancelled.discard(rid)
        self.finished[rid] = None
        while len(self.finished) > FINISHED_MEMORY:
            self.finished.popitem(last=False)
        if done is not None:
            self._put(pb.GenerateResponse(request_id=rid, done=done))
        else:
            assert error is not None
            self._put(pb.GenerateResponse(request_id=rid, error=error))
        self._maybe_close()

    def _put_error(self, rid: str, status: str, message: str, retry_after_ms: int = 0, quota: str = "") -> None:
        self._put(pb.GenerateResponse(request_id=rid, error=error_proto(status, message, retry_after_ms, quota)))

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
    def on_sent(self) -> None:
        """The RPC wrote one message to the transport."""
        self.backlog.on_sent()

    def _set_paused(self, paused: bool) -> None:
        for seq in self._all_choices():
            self.intake.pause(seq, paused)

    def _on_stall(self) -> None:
        """The client has not read for ``stall_timeout_s``: cancel its requests."""
        log.warning("a Generate stream was not read for %.0f s; cancelling its requests", self.limits.stall_timeout_s)
        message = f"cancelled: the client did not read its stream for {self.limits.stall_timeout_s:g} s"
        for seq in self._all_choices():
            self.intake.abort(seq, Error("CANCELLED", message))

    def abort_all(self) -> None:
        """The RPC ended (client closed, deadline, error): cancel what is still running."""
        self.closed = True
        self.backlog.cancel_stall()
        for task in list(self.tasks):
            task.cancel()
        for seq in self._all_choices():
            self.intake.abort(seq)
        self.active.clear()

    def _all_choices(self) -> list[Sequence]:
        """Every submitted sequence of the stream's in-flight requests."""
        return [c for seq in list(self.active.values()) if seq is not None for c in members(seq)]
