"""gRPC servicer: a thin translator between protos and engine ``Sequence``s.

RPC handlers prepare a Sequence and submit it through the ``Intake``
(``service.api.intake``, shared with the batch service), and stream the
engine's events back. Client cancellation (cancel message, closed stream,
expired deadline) becomes ``intake.abort``. ``Generate``'s per-stream state
lives in ``service.api.generate_stream``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.api.cache_front import Replay
from service.api.generate_stream import GenerateStream, StreamLimits
from service.api.intake import Intake, Need, rejection, rpc_deadline, unavailable_metadata
from service.api.json_layout import pretty_json
from service.api.model_rpcs import ModelApi, model_api_for
from service.api.proto_convert import done_proto, logprob_proto
from service.api.stream_backlog import ACKS_METADATA_KEY
from service.continuous_batcher import Draining
from service.observability.metrics_view import metrics_response
from service.priority import QueueFull
from service.request.errors import BadRequest
from service.request.events import Delta, Done, Error
from service.request.sequence import FinishReason, Sequence
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
        stream = GenerateStream(self.intake, context, self.stream_limits)
        if stream.backlog.acks:  # the client offered acknowledgements: accept them
            await context.send_initial_metadata(((ACKS_METADATA_KEY, "1"),))
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
        await self.intake.require(context, Need.WORK)
        if not request.json_schema:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "json_schema is empty")
        result: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        seq = await self._prepare_json(request, context, result)
        if (replay := await self.intake.cache.before_submit(seq, request, json_mode=True)) is not None:
            return _laid_out(await self._cached_json(seq, replay, context), request.pretty)
        try:
            self.intake.submit(seq)
        except (QueueFull, Draining) as exc:
            r = rejection(exc)
            quota = ((QUOTA_METADATA_KEY, r.quota),) if r.quota else ()
            reason = unavailable_metadata(r.reason)
            context.set_trailing_metadata((("retry-after-ms", str(r.retry_after_ms)), *quota, *reason))
            await context.abort(grpc.StatusCode[r.status], r.message)
        try:
            evs = await result
        except asyncio.CancelledError:
            self.intake.abort(seq)
            raise
        return _laid_out(await self._json_response(seq, evs, context), request.pretty)

    async def _prepare_json(
        self, request: pb.GenerateJSONRequest, context: grpc.aio.ServicerContext, result: asyncio.Future[Any]
    ) -> Sequence:
        """The request's Sequence, with an ``emit`` that completes ``result``; aborts on bad input."""
        try:
            seq = await self.intake.prepare(
                f"json-{id(result):x}",
                request.prompt,
                request.messages,
                request.sampling,
                request.priority,
                ("json_schema", request.json_schema),
                rpc_deadline(context),
                json_mode=True,
                raw_prompt=request.raw_prompt,
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
                    self.intake.finished(seq, ev)
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
            context.set_trailing_metadata(unavailable_metadata(last.reason))
            await context.abort(grpc.StatusCode[last.status], last.message)
        text = "".join(e.text for e in evs if isinstance(e, Delta))
        if last.finish_reason is FinishReason.LENGTH:
            hint = "" if seq.params.json_finish else " or set json_finish CLOSE_WITHIN_BUDGET"
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"JSON document cut off at max_tokens={seq.params.max_tokens}; raise max_tokens{hint}",
            )
        if last.finish_reason is FinishReason.CANCELLED:
            await context.abort(grpc.StatusCode.CANCELLED, "request cancelled")
        try:
            self.intake.grammar.validate(seq.grammar, text)
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


def _laid_out(response: pb.GenerateJSONResponse, pretty: bool) -> pb.GenerateJSONResponse:
    """GenerateJSONRequest.pretty: the document indented (``service.api.json_layout``)."""
    if pretty:
        response.json = pretty_json(response.json)
    return response
