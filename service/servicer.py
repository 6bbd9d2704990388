"""gRPC servicer: a thin translator between protos and engine ``Sequence``s.

RPC handlers validate and build a Sequence, ``submit`` it, and stream the
engine's events back. Client cancellation (cancel message, closed stream,
expired deadline) becomes ``engine.abort``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.auth import current_tenant
from service.continuous_batcher import Draining, Engine
from service.events import Delta, Done, Error
from service.grammar_service import GrammarService
from service.metrics_view import metrics_response
from service.priority import QueueFull
from service.requests import BadRequest, RequestBuilder
from service.sequence import FinishReason, Sequence
from service.telemetry import Telemetry
from service.tenancy import Tenancy
from service.textstream import TextStream

log = logging.getLogger("service.rpc")

FINISH = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}


def done_proto(d: Done) -> pb.Done:
    return pb.Done(
        finish_reason=FINISH.get(d.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
        usage=pb.Usage(
            prompt_tokens=d.prompt_tokens,
            completion_tokens=d.completion_tokens,
            cached_tokens=d.cached_tokens,
        ),
        timing=pb.Timing(queue_ms=d.queue_ms, ttft_ms=d.ttft_ms, total_ms=d.total_ms),
        preemptions=d.preemptions,
    )


def error_proto(status: str, message: str, retry_after_ms: int = 0) -> pb.Error:
    code = grpc.StatusCode[status]
    return pb.Error(code=code.value[0], status=status, message=message, retry_after_ms=retry_after_ms)


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    """Implements inference.v1.InferenceService on top of one Engine."""

    # NOTE: constructed before the model loads (the server listens and answers
    # health NOT_SERVING meanwhile); ``attach`` supplies the engine once ready.
    engine: Engine
    builder: RequestBuilder
    grammar: GrammarService

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.tenancy = Tenancy()  # the server sets its own (tenants file, quotas)
        self.ready = False

    def attach(self, engine: Engine, builder: RequestBuilder, grammar: GrammarService) -> None:
        self.engine, self.builder, self.grammar = engine, builder, grammar
        self.ready = True

    async def _check_ready(self, context: grpc.aio.ServicerContext) -> None:
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model is loading; retry shortly")
        if self.engine.draining:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "server is shutting down; retry on another replica"
            )

    # -- shared request preparation ---------------------------------------------------------
    async def prepare(
        self,
        request_id: str,
        prompt: str,
        messages: Any,
        sampling: pb.SamplingParams,
        priority: int,
        fmt: tuple[str, str] | None,
        deadline: float | None,
        json_mode: bool = False,
    ) -> Sequence:
        """Validate a request into a ready-to-submit Sequence; raises BadRequest."""
        prio = self.builder.priority(priority)
        ids = self.builder.prompt_ids(prompt, list(messages))
        params = self.builder.sampling(sampling, len(ids), json_mode=json_mode)
        seq = Sequence(request_id=request_id, token_ids=ids, params=params, priority=prio, deadline=deadline)
        seq.tenant = current_tenant()  # set by service.auth's interceptor
        seq.text = TextStream(self.builder.vocab.token_bytes, params.stop)
        if fmt is not None:
            seq.matcher, seq.grammar = await self.grammar.matcher_for(*fmt)
        return seq

    def submit(self, seq: Sequence) -> None:
        """Submit; QueueFull/Draining propagate to the caller (telemetry sees them as the request's end)."""
        self.telemetry.on_submit(seq)
        try:
            self.tenancy.submit(seq, self.engine.submit)  # per-tenant quotas first (QuotaExceeded)
        except (QueueFull, Draining) as exc:
            status = "RESOURCE_EXHAUSTED" if isinstance(exc, QueueFull) else "UNAVAILABLE"
            self.telemetry.on_finish(seq, Error(status, str(exc)))
            raise

    # -- Generate ------------------------------------------------------------------------------
    async def Generate(
        self, request_iterator: AsyncIterator[pb.GenerateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        await self._check_ready(context)
        stream = _GenerateStream(self, context)
        reader = asyncio.create_task(stream.read(request_iterator))
        try:
            while True:
                item = await stream.out.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            stream.abort_all()

    # -- GenerateJSON ------------------------------------------------------------------------
    async def GenerateJSON(
        self, request: pb.GenerateJSONRequest, context: grpc.aio.ServicerContext
    ) -> pb.GenerateJSONResponse:
        await self._check_ready(context)
        if not request.json_schema:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "json_schema is empty")
        result: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        events: list[Any] = []

        def on_event(ev: Any) -> None:
            events.append(ev)
            if isinstance(ev, Done | Error) and not result.done():
                self.telemetry.on_finish(seq, ev)
                result.set_result(events)

        try:
            seq = await self.prepare(
                f"json-{id(result):x}",
                request.prompt,
                request.messages,
                request.sampling,
                request.priority,
                ("json_schema", request.json_schema),
                _deadline(context),
                json_mode=True,
            )
            seq.emit = on_event
            self.submit(seq)
        except BadRequest as exc:
            await context.abort(grpc.StatusCode[exc.status], str(exc))
        except QueueFull as exc:
            quota = (("inference-quota", exc.quota),) if exc.quota else ()
            context.set_trailing_metadata((("retry-after-ms", str(exc.retry_after_ms)), *quota))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Draining as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        try:
            evs = await result
        except asyncio.CancelledError:
            self.engine.abort(seq)
            raise
        return await self._json_response(seq, evs, context)

    async def _json_response(
        self, seq: Sequence, evs: list[Any], context: grpc.aio.ServicerContext
    ) -> pb.GenerateJSONResponse:
        last = evs[-1]
        if isinstance(last, Error):
            await context.abort(grpc.StatusCode[last.status], last.message)
        text = "".join(e.text for e in evs if isinstance(e, Delta))
        if last.finish_reason is FinishReason.LENGTH:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"JSON document cut off at max_tokens={seq.params.max_tokens}; raise max_tokens",
            )
        if last.finish_reason is FinishReason.CANCELLED:
            await context.abort(grpc.StatusCode.CANCELLED, "request cancelled")
        try:
            self.grammar.validate(seq.grammar, text)
        except BadRequest as exc:
            await context.abort(grpc.StatusCode[exc.status], str(exc))
        d = done_proto(last)
        return pb.GenerateJSONResponse(
            json=text, usage=d.usage, timing=d.timing, finish_reason=d.finish_reason
        )

    # -- GetMetrics ------------------------------------------------------------------------------
    async def GetMetrics(self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext) -> Any:
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model is loading; retry shortly")
        return metrics_response(self.engine, self.grammar, self.tenancy)


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return time.monotonic() + remaining if remaining is not None else None


class _GenerateStream:
    """One Generate stream: its in-flight requests and its outgoing queue (event-loop only)."""

    def __init__(self, servicer: InferenceServicer, context: grpc.aio.ServicerContext) -> None:
        self.sv = servicer
        self.context = context
        self.out: asyncio.Queue[pb.GenerateResponse | None] = asyncio.Queue()
        self.active: dict[str, Sequence | None] = {}  # None while the request is being prepared
        self.cancelled: set[str] = set()
        self.reading = True
        self.tasks: set[asyncio.Task[None]] = set()

    async def read(self, requests: AsyncIterator[pb.GenerateRequest]) -> None:
        try:
            async for req in requests:
                self.on_request(req)
        except Exception as exc:  # client went away mid-read
            log.debug("generate stream read ended: %s", exc)
        finally:
            self.reading = False
            self._maybe_close()

    def on_request(self, req: pb.GenerateRequest) -> None:
        rid = req.request_id
        if req.cancel:
            self._cancel(rid)
        elif not rid:
            self._error(rid, "INVALID_ARGUMENT", "request_id is empty")
        elif rid in self.active:
            self._error(
                rid, "INVALID_ARGUMENT", f"duplicate request_id {rid!r}: a request with it is in flight"
            )
        else:
            self.active[rid] = None
            task = asyncio.create_task(self._start(req))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _start(self, req: pb.GenerateRequest) -> None:
        rid = req.request_id
        fmt = _format(req.response_format) if req.HasField("response_format") else None
        try:
            seq = await self.sv.prepare(
                rid, req.prompt, req.messages, req.sampling, req.priority, fmt, _deadline(self.context)
            )
        except BadRequest as exc:
            self._finish_error(rid, exc.status, str(exc))
            return
        if rid in self.cancelled:  # cancelled while being prepared
            self.cancelled.discard(rid)
            self.active.pop(rid, None)
            self._put(
                pb.GenerateResponse(request_id=rid, done=pb.Done(finish_reason=pb.FINISH_REASON_CANCELLED))
            )
            return
        seq.emit = functools.partial(self.on_event, seq)
        try:
            self.sv.submit(seq)
        except QueueFull as exc:
            self._finish_error(rid, "RESOURCE_EXHAUSTED", str(exc), exc.retry_after_ms)
            return
        except Draining as exc:
            self._finish_error(rid, "UNAVAILABLE", str(exc), 1000)
            return
        self.active[rid] = seq

    def on_event(self, seq: Sequence, ev: Any) -> None:
        rid = seq.request_id
        if isinstance(ev, Delta):
            self._put(
                pb.GenerateResponse(request_id=rid, delta=pb.Delta(text=ev.text, token_ids=ev.token_ids))
            )
            return
        if self.active.get(rid) is seq:
            del self.active[rid]
        self.sv.telemetry.on_finish(seq, ev)
        if isinstance(ev, Done):
            self._put(pb.GenerateResponse(request_id=rid, done=done_proto(ev)))
        else:
            self._put(pb.GenerateResponse(request_id=rid, error=error_proto(ev.status, ev.message)))
        self._maybe_close()

    def _cancel(self, rid: str) -> None:
        if rid not in self.active:
            self._error(rid, "NOT_FOUND", f"cancel: no request {rid!r} in flight on this stream")
            return
        seq = self.active[rid]
        if seq is None:
            self.cancelled.add(rid)
        else:
            self.sv.engine.abort(seq)

    def _error(self, rid: str, status: str, message: str, retry_after_ms: int = 0) -> None:
        self._put(pb.GenerateResponse(request_id=rid, error=error_proto(status, message, retry_after_ms)))

    def _finish_error(self, rid: str, status: str, message: str, retry_after_ms: int = 0) -> None:
        self.active.pop(rid, None)
        self.cancelled.discard(rid)
        self._error(rid, status, message, retry_after_ms)
        self._maybe_close()

    def _put(self, msg: pb.GenerateResponse) -> None:
        self.out.put_nowait(msg)

    def _maybe_close(self) -> None:
        if not self.reading and not self.active:
            self.out.put_nowait(None)

    def abort_all(self) -> None:
        """The stream ended (client closed, deadline, error): cancel what is still running."""
        for task in list(self.tasks):
            task.cancel()
        for seq in self.active.values():
            if seq is not None:
                self.sv.engine.abort(seq)
        self.active.clear()


def _format(rf: pb.ResponseFormat) -> tuple[str, str] | None:
    kind = rf.WhichOneof("format")
    if kind is None:
        return None
    names = {"json_schema": "json_schema", "regex": "regex", "lark_grammar": "lark", "gbnf_grammar": "gbnf"}
    return names[kind], getattr(rf, kind)
