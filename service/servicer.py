"""gRPC servicer: a thin translator between protos and engine ``Sequence``s.

RPC handlers validate and build a Sequence, ``submit`` it, and stream the
engine's events back. Client cancellation (cancel message, closed stream,
expired deadline) becomes ``engine.abort``. ``Generate``'s per-stream state
lives in ``service.generate_stream``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.auth import current_tenant
from service.choices import link_choices
from service.continuous_batcher import Draining, Engine
from service.events import Delta, Done, Error
from service.generate_stream import GenerateStream, StreamLimits
from service.grammar_service import GrammarService
from service.metrics_view import metrics_response
from service.model_api import ModelApi, model_api_for
from service.priority import QueueFull
from service.protos import done_proto, logprob_proto
from service.requests import BadRequest, RequestBuilder
from service.response_cache import CacheFront, Replay
from service.sequence import FinishReason, Sequence
from service.telemetry import Telemetry
from service.tenancy import Tenancy
from service.textstream import TextStream

log = logging.getLogger("service.rpc")
DEADLINE_MARGIN_S = 0.05


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    """Implements inference.v1.InferenceService on top of one Engine."""

    # NOTE: constructed before the model loads (the server listens and answers
    # health NOT_SERVING meanwhile); ``attach`` supplies the engine once ready.
    engine: Engine
    builder: RequestBuilder
    grammar: GrammarService
    model_api: ModelApi

    def __init__(self, telemetry: Telemetry, stream_limits: StreamLimits | None = None) -> None:
        self.telemetry = telemetry
        self.tenancy = Tenancy()  # the server sets its own (tenants file, quotas)
        self.stream_limits = stream_limits or StreamLimits()
        self.cache = CacheFront(None, telemetry)  # the server sets its own (service.response_cache)
        self.ready = False

    def attach(self, engine: Engine, builder: RequestBuilder, grammar: GrammarService) -> None:
        self.engine, self.builder, self.grammar = engine, builder, grammar
        self.model_api = model_api_for(engine, builder)  # starts hashing the model file
        self.ready = True

    async def _check_ready(self, context: grpc.aio.ServicerContext) -> None:
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model is loading; retry shortly")
        if self.engine.failure is not None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"engine failed ({self.engine.failure}); retry on another replica"
            )
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
        if params.stop and (json_mode or (fmt is not None and fmt[0] == "json_schema")):
            raise BadRequest(
                "stop strings cannot be combined with a JSON Schema: a document cut at a stop string "
                "would not be valid JSON (the grammar ends the document itself)"
            )
        seq = Sequence(request_id=request_id, token_ids=ids, params=params, priority=prio, deadline=deadline)
        seq.tenant = current_tenant()  # set by service.auth's interceptor
        seq.text = TextStream(self.builder.vocab.token_bytes, params.stop)
        if fmt is not None:
            seq.matcher, seq.grammar = await self.grammar.matcher_for(*fmt)
            seq.keys = self.grammar.key_guard(fmt[0])
        return seq

    async def prepare_choices(self, request_id: str, *args: Any) -> list[Sequence]:
        """``prepare`` once per choice (SamplingParams.n), linked to share one prompt; raises BadRequest."""
        first = await self.prepare(request_id, *args)
        rest = [await self.prepare(request_id, *args) for _ in range(1, first.params.n)]
        return link_choices([first, *rest])

    def submit(self, seq: Sequence) -> None:
        """Submit; QueueFull/Draining propagate to the caller (telemetry sees them as the request's end)."""
        self.telemetry.on_submit(seq)
        try:
            self.tenancy.submit(seq, self.engine.submit)  # per-tenant quotas first (QuotaExceeded)
        except (QueueFull, Draining) as exc:
            status = "RESOURCE_EXHAUSTED" if isinstance(exc, QueueFull) else "UNAVAILABLE"
            self.telemetry.on_finish(seq, Error(status, str(exc)))
            self.cache.submitted(seq, False)
            raise
        self.cache.submitted(seq, True)

    @staticmethod
    def deadline(context: grpc.aio.ServicerContext) -> float | None:
        """The request's deadline: the RPC's, a little early.

        NOTE: ending a request just before the RPC's own deadline lets the
        client receive the server's event saying why (expired while queued)
        instead of a bare DEADLINE_EXCEEDED from its own timer.
        """
        remaining = context.time_remaining()
        if remaining is None:
            return None
        return time.monotonic() + remaining - min(DEADLINE_MARGIN_S, remaining / 10)

    # -- Generate ------------------------------------------------------------------------------
    async def Generate(
        self, request_iterator: AsyncIterator[pb.GenerateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        await self._check_ready(context)
        stream = GenerateStream(self, context, self.stream_limits)
        reader = asyncio.create_task(stream.read(request_iterator))
        try:
            while (item := await stream.out.get()) is not None:
                yield item
                stream.on_sent()
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
        seq = await self._prepare_json(request, context, result)
        if (replay := await self.cache.before_submit(seq, request, json_mode=True)) is not None:
            return await self._cached_json(seq, replay, context)
        try:
            self.submit(seq)
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

    async def _prepare_json(
        self, request: pb.GenerateJSONRequest, context: grpc.aio.ServicerContext, result: asyncio.Future[Any]
    ) -> Sequence:
        """The request's Sequence, with an ``emit`` that completes ``result``; aborts on bad input."""
        try:
            seq = await self.prepare(
                f"json-{id(result):x}",
                request.prompt,
                request.messages,
                request.sampling,
                request.priority,
                ("json_schema", request.json_schema),
                self.deadline(context),
                json_mode=True,
            )
            if seq.params.n != 1 or seq.params.echo_prompt_logprobs:
                raise BadRequest("GenerateJSON returns one document: n and echo_prompt_logprobs need Generate")
        except BadRequest as exc:
            failure = (grpc.StatusCode[exc.status], str(exc))
        except Exception as exc:  # a bug or an environment failure: this request only
            log.exception("preparing a GenerateJSON request failed")
            failure = (grpc.StatusCode.INTERNAL, f"preparing the request failed: {type(exc).__name__}")
        else:
            events: list[Any] = []

            def on_event(ev: Any) -> None:
                events.append(ev)
                if isinstance(ev, Done | Error) and not result.done():
                    self.telemetry.on_finish(seq, ev)
                    result.set_result(events)

            seq.emit = on_event
            return seq
        await context.abort(*failure)
        raise AssertionError("unreachable")  # pragma: no cover - abort raises

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
        logprobs = [logprob_proto(e) for ev in evs if isinstance(ev, Delta) for e in ev.logprobs]
        return pb.GenerateJSONResponse(
            json=text, usage=d.usage, timing=d.timing, finish_reason=d.finish_reason, logprobs=logprobs
        )

    async def _cached_json(
        self, seq: Sequence, replay: Replay, context: grpc.aio.ServicerContext
    ) -> pb.GenerateJSONResponse:
        """A response-cache answer: the stored document (validated again) or the cache's error status."""
        hit = replay.hit
        if hit is None:
            status, message, _ = replay.error or ("CANCELLED", "request cancelled", 0)
            await context.abort(grpc.StatusCode[status], message)
            raise AssertionError("unreachable")  # pragma: no cover - abort raises
        response = await self._json_response(seq, replay.events, context)
        response.cache_hit = True
        response.semantic_cache_hit = hit.semantic
        return response

    # -- GetMetrics ------------------------------------------------------------------------------
    async def GetMetrics(self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext) -> Any:
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model is loading; retry shortly")
        return metrics_response(self.engine, self.grammar, self.tenancy, self.cache.metrics())

    # -- Tokenize / Detokenize / CountTokens / GetModelInfo (service.model_api) ------------------
    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._model_call(context, lambda: self.model_api.tokenize(request))

    async def Detokenize(self, request: pb.DetokenizeRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._model_call(context, lambda: self.model_api.detokenize(request))

    async def CountTokens(self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._model_call(context, lambda: self.model_api.count_tokens(request))

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._model_call(context, lambda: self.model_api.model_info())

    async def _model_call(self, context: grpc.aio.ServicerContext, call: Any) -> Any:
        """Answer a model RPC (``call()``, once the model is loaded); a BadRequest becomes its status."""
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model is loading; retry shortly")
        try:
            return await call()
        except BadRequest as exc:
            await context.abort(grpc.StatusCode[exc.status], str(exc))
