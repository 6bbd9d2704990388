"""Asyncio client of inference.v1.InferenceService (``grpc.aio``).

Same API as :class:`~inference_client.client.InferenceClient`, with ``await``
on unary calls and ``async for`` on streams::

    async with AsyncInferenceClient("localhost:50051") as client:
        async for event in client.generate("Hello", max_tokens=16):
            ...

Create it inside the event loop that uses it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from .aio_stream import AsyncGenerateStream, AsyncGeneration
from .balancing import balanced_options, balancing_mode
from .client import DEFAULT_TARGET
from .metrics import metrics_to_dict
from .model_calls import count_request, detokenize_request, tokenize_request
from .retry import RetryPolicy, acall_with_retry
from .security import make_aio_channel, with_token
from .spec import GenerateOptions, MessageLike, RequestSpec, SamplingOptions, json_request
from .stream import StreamRegistry
from .tools import ToolChoiceLike, ToolLike


class AsyncInferenceClient:
    """Asyncio client bound to one ``grpc.aio`` channel; arguments as for ``InferenceClient``."""

    def __init__(
        self,
        target: str | None = None,
        *,
        channel: grpc.aio.Channel | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        metadata: Sequence[tuple[str, str]] | None = None,
        options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
    ) -> None:
        self._owns_channel = channel is None
        target = target or DEFAULT_TARGET
        # dns:/ipv4:/ipv6: targets get round_robin with health checking, as in the sync client
        lb_options = balanced_options(balancing_mode("auto", target), options)
        self.channel = channel or make_aio_channel(target, credentials, lb_options)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.metadata = with_token(metadata, token)
        self._stub = pb_grpc.InferenceServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._registry = StreamRegistry()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def open_stream(self, *, timeout: float | None = None) -> AsyncGenerateStream:
        """An empty multiplexed stream; ``await submit(...)`` requests, then ``await close()``."""
        return AsyncGenerateStream(
            self._stub,
            policy=self.retry,
            timeout=self._timeout(timeout),
            metadata=self.metadata,
            registry=self._registry,
        )

    def generate(
        self,
        prompt: str | None = None,
        messages: Sequence[MessageLike] | None = None,
        *,
        request_id: str | None = None,
        timeout: float | None = None,
        **options: Unpack[GenerateOptions],
    ) -> AsyncGeneration:
        """Stream one generation (``async for``): ``Delta`` events, then ``Done``.

        Arguments as for ``InferenceClient.generate``. The RPC starts on the first iteration.
        """
        stream = self.open_stream(timeout=timeout)
        rid = stream.add(RequestSpec(prompt=prompt, messages=messages, request_id=request_id, **options))
        stream.seal()
        return AsyncGeneration(stream, rid)

    def generate_many(
        self,
        requests: Iterable[RequestSpec | str],
        *,
        timeout: float | None = None,
        **options: Unpack[GenerateOptions],
    ) -> AsyncGenerateStream:
        """Many requests on ONE Generate stream; ``async for (request_id, event)`` or ``await collect()``."""
        stream = self.open_stream(timeout=timeout)
        for item in requests:
            stream.add(RequestSpec(prompt=item, **options) if isinstance(item, str) else item)
        stream.seal()
        return stream

    async def cancel(self, request_id: str) -> bool:
        """Cancel an in-flight request of any of this client's streams; False if none has it."""
        stream = self._registry.owner(request_id)
        return stream is not None and bool(await stream.cancel(request_id))

    async def generate_json_response(
        self,
        schema: Mapping[str, Any] | str,
        prompt: str | None = None,
        messages: Sequence[MessageLike] | None = None,
        *,
        timeout: float | None = None,
        **options: Unpack[SamplingOptions],
    ) -> pb.GenerateJSONResponse:
        """Call GenerateJSON; return the raw response (document text, usage, timing; a reasoning model's
        thought in ``reasoning``, its tokens in ``usage.reasoning_tokens``)."""
        request = json_request(schema, RequestSpec(prompt=prompt, messages=messages, **options))
        return await acall_with_retry(
            lambda t: self._stub.GenerateJSON(request, timeout=t, metadata=self.metadata),
            self.retry,
            self._timeout(timeout),
        )

    async def generate_json(
        self,
        schema: Mapping[str, Any] | str,
        prompt: str | None = None,
        messages: Sequence[MessageLike] | None = None,
        *,
        timeout: float | None = None,
        **options: Unpack[SamplingOptions],
    ) -> Any:
        """One JSON document valid against ``schema``, parsed (a dict for object schemas)."""
        resp = await self.generate_json_response(schema, prompt, messages, timeout=timeout, **options)
        return json.loads(resp.json)

    async def metrics(self, *, timeout: float | None = None) -> pb.GetMetricsResponse:
        """The engine's metrics snapshot."""
        return await acall_with_retry(
            lambda t: self._stub.GetMetrics(pb.GetMetricsRequest(), timeout=t, metadata=self.metadata),
            self.retry,
            self._timeout(timeout),
        )

    async def metrics_dict(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The metrics snapshot as a plain dict."""
        return metrics_to_dict(await self.metrics(timeout=timeout))

    async def tokenize(
        self,
        text: str | None = None,
        messages: Sequence[MessageLike] | None = None,
        *,
        add_special: bool | None = None,
        parse_special: bool | None = None,
        tools: Sequence[ToolLike] | None = None,
        tool_choice: ToolChoiceLike | None = None,
        timeout: float | None = None,
    ) -> pb.TokenizeResponse:
        """Token ids and pieces of ``text`` or of ``messages`` rendered exactly as Generate renders them."""
        request = tokenize_request(text, messages, add_special, parse_special, tools, tool_choice)
        return await self._unary(self._stub.Tokenize, request, timeout)

    async def count_tokens(
        self,
        text: str | None = None,
        messages: Sequence[MessageLike] | None = None,
        *,
        add_special: bool | None = None,
        parse_special: bool | None = None,
        tools: Sequence[ToolLike] | None = None,
        tool_choice: ToolChoiceLike | None = None,
        timeout: float | None = None,
    ) -> pb.CountTokensResponse:
        """The prompt's token count (Generate's usage.prompt_tokens), context size and room left."""
        request = count_request(text, messages, add_special, parse_special, tools, tool_choice)
        return await self._unary(self._stub.CountTokens, request, timeout)

    async def detokenize(
        self, token_ids: Sequence[int], *, render_special: bool = False, timeout: float | None = None
    ) -> pb.DetokenizeResponse:
        """The text (and exact bytes) of ``token_ids``."""
        return await self._unary(self._stub.Detokenize, detokenize_request(token_ids, render_special), timeout)

    async def model_info(self, *, timeout: float | None = None) -> pb.GetModelInfoResponse:
        """The served model, its limits and the request options it accepts (``model_info_to_dict``)."""
        return await self._unary(self._stub.GetModelInfo, pb.GetModelInfoRequest(), timeout)

    async def _unary(self, method: Any, request: Any, timeout: float | None) -> Any:
        return await acall_with_retry(
            lambda t: method(request, timeout=t, metadata=self.metadata), self.retry, self._timeout(timeout)
        )

    async def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """grpc.health.v1 status of ``service`` ("" = the server), e.g. "SERVING"."""
        request = health_pb2.HealthCheckRequest(service=service)
        resp = await acall_with_retry(
            lambda t: self._health.Check(request, timeout=t, metadata=self.metadata),
            self.retry,
            self._timeout(timeout),
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

    async def close(self) -> None:
        """Close the channel if the client created it."""
        if self._owns_channel:
            await self.channel.close()

    async def __aenter__(self) -> AsyncInferenceClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
