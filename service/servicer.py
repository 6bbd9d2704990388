"""gRPC servicer: a thin translator between protos and the request lifecycle.

``Generate`` turns each request message into an ``Ask`` for the lifecycle
(``service.api.intake``; per-stream ids, cancel and backpressure in
``service.api.generate_stream``); ``GenerateJSON`` is the lifecycle plus the
JSON document's checks and layout. Client cancellation (cancel message, closed
stream, expired deadline) cancels the request's flight.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.api.ask import Ask
from service.api.generate_stream import GenerateStream, StreamLimits
from service.api.intake import Intake
from service.api.json_layout import pretty_json
from service.api.model_rpcs import ModelApi, model_api_for
from service.api.proto_convert import done_proto, logprob_proto, status_details
from service.api.readiness import Need, rpc_deadline, unavailable_metadata
from service.api.reasoning import split_deltas
from service.api.stream_backlog import ACKS_METADATA_KEY, acknowledges
from service.observability.metrics_view import metrics_response
from service.request.errors import BadRequest
from service.request.events import Delta, Done, Error, Event
from service.request.sequence import FinishReason
from service.security.quotas import QUOTA_METADATA_KEY

log = logging.getLogger("service.rpc")


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    """Implements inference.v1.InferenceService over one ``Intake`` (and so one Engine)."""

    model_api: ModelApi

    def __init__(self, intake: Intake, stream_limits: StreamLimits | None = None) -> None:
        self.intake = intake
        self.stream_limits = stream_limits or StreamLimits()

    def attach(self) -> None:
        """The intake has its engine: start the model RPCs (hashes the model file in the background)."""
        self.model_api = model_api_for(self.intake.engine, self.intake.builder)

    # -- Generate ------------------------------------------------------------------------------
    async def Generate(
        self, request_iterator: AsyncIterator[pb.GenerateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        await self.intake.require(context, Need.WORK)
        acks = acknowledges(context.invocation_metadata())
        stream = GenerateStream(self.intake, rpc_deadline(context), self.stream_limits, acks)
        if acks:  # the client offered acknowledgements: accept them
            await context.send_initial_metadata(((ACKS_METADATA_KEY, "1"),))
        reader = asyncio.create_task(stream.read(request_iterator))
        try:
            while (item := await stream.out.get()) is not None:
                stream.on_write()
                yield item  # NOTE: grpc.aio resumes the handler once the write has completed
                stream.on_sent()
        finally:
            reader.cancel()
            stream.abort_all()

    # -- GenerateJSON: the lifecycle, then the document's checks and layout ------------------------
    async def GenerateJSON(
        self, request: pb.GenerateJSONRequest, context: grpc.aio.ServicerContext
    ) -> pb.GenerateJSONResponse:
        ask = Ask.generate_json(request, f"json-{uuid.uuid4().hex}", rpc_deadline(context), reasons=True)
        events = await self.intake.collect(ask)
        last = events[-1]
        if isinstance(last, Error):
            await _abort(context, last)
        assert isinstance(last, Done)
        response = await self._document(request, ask, events, last, context)
        if request.pretty:
            response.json = pretty_json(response.json)
        return response

    async def _document(
        self, request: pb.GenerateJSONRequest, ask: Ask, events: list[Event], last: Done,
        context: grpc.aio.ServicerContext,
    ) -> pb.GenerateJSONResponse:
        """The finished document, validated again (a cache hit too); aborts for a cut-off or cancelled one. A
        reasoning model's thought is read apart (``service.api.reasoning``): ``json`` is the document alone."""
        deltas = [e for e in events if isinstance(e, Delta)]
        thought, text, thought_tokens = split_deltas(ask.thought, deltas)
        if last.finish_reason is FinishReason.LENGTH:
            finish = request.sampling.json_finish
            closing = finish == pb.JSON_FINISH_CLOSE_WITHIN_BUDGET or (
                finish == pb.JSON_FINISH_UNSPECIFIED and self.intake.builder.json.close_within_budget
            )
            # NOTE: a document after a thought is never closed within the budget: no hint of json_finish there
            hint = "" if closing or ask.after_thought else " or set json_finish CLOSE_WITHIN_BUDGET"
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"JSON document cut off at max_tokens={last.completion_tokens}; raise max_tokens{hint}",
            )
        if last.finish_reason is FinishReason.CANCELLED:
            await context.abort(grpc.StatusCode.CANCELLED, "request cancelled")
        try:
            schema = await self.intake.grammar.compiled("json_schema", request.json_schema, record=False)
            self.intake.grammar.validate(schema, text)
        except BadRequest as exc:  # a document that breaks what the grammar could not enforce
            await _abort(context, Error(exc.status, str(exc), exc.reason))
        d = done_proto(last)
        d.usage.reasoning_tokens = thought_tokens
        logprobs = [logprob_proto(e) for ev in deltas for e in ev.logprobs]
        return pb.GenerateJSONResponse(
            json=text, usage=d.usage, timing=d.timing, finish_reason=d.finish_reason, logprobs=logprobs,
            cache_hit=last.cache_hit, semantic_cache_hit=last.semantic_cache_hit, reasoning=thought,
        )

    # -- GetMetrics ------------------------------------------------------------------------------
    async def GetMetrics(self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.intake.require(context, Need.MODEL)
        i = self.intake
        return metrics_response(i.engine, i.grammar, i.tenancy, i.cache.metrics())

    # -- Tokenize / Detokenize / CountTokens / GetModelInfo (service.api.model_rpcs) ------------------
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
        await self.intake.require(context, Need.MODEL)
        try:
            return await call()
        except BadRequest as exc:
            await context.abort(grpc.StatusCode[exc.status], str(exc))


async def _abort(context: grpc.aio.ServicerContext, e: Error) -> None:
    """End a unary RPC with the request's error; its retry hint, quota and reason in the trailing metadata
    (the reason as the status detail ``google.rpc.ErrorInfo``; UNAVAILABLE's also under its own key)."""
    metadata: list[tuple[str, str | bytes]] = [("retry-after-ms", str(e.retry_after_ms))] if e.retry_after_ms else []
    metadata += [(QUOTA_METADATA_KEY, e.quota)] if e.quota else []
    if e.status == "UNAVAILABLE":
        metadata += unavailable_metadata(e.reason)
    context.set_trailing_metadata((*metadata, *status_details(e)))
    await context.abort(grpc.StatusCode[e.status], e.message)
