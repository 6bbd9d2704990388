"""Sync client of inference.v1.InferenceService.

Example::

    from inference_client import InferenceClient

    with InferenceClient("localhost:50051", timeout=60) as client:
        for event in client.generate("Once upon a time", max_tokens=32, temperature=0):
            print(getattr(event, "text", ""), end="", flush=True)

Every failure raises :class:`~inference_client.errors.InferenceError`. Unary
calls and not-yet-answered streams are retried per the client's
:class:`~inference_client.retry.RetryPolicy`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from .balancing import AffinityPool, balanced_options, balancing_mode
from .batch import BatchApi
from .generation import Generation
from .metrics import metrics_to_dict
from .model_calls import count_request, detokenize_request, tokenize_request
from .retry import RetryPolicy, call_with_retry
from .ring import prefix_key
from .security import make_channel, with_token
from .spec import GenerateOptions, MessageLike, RequestSpec, SamplingOptions, json_request
from .stream import GenerateStream, StreamRegistry
from .tools import ToolChoiceLike, ToolLike

DEFAULT_TARGET = "localhost:50051"


class InferenceClient:
    """Client bound to one channel: from a ``target`` ("host:port") or an existing ``channel``.

    Args:
        target: server address; ignored when ``channel`` is given.
        channel: a channel to use; the client does not close it.
        timeout: default deadline in seconds of every call (None = no deadline);
            for streams it bounds the whole stream, retries included.
        retry: client-side retry policy (default ``RetryPolicy()``; ``NO_RETRY`` disables).
        metadata: extra request metadata sent with every call.
        credentials: TLS channel credentials (``security.secure_credentials``); None = plaintext.
        token: bearer token sent as ``authorization`` metadata with every call (docs/security.md).
        options: channel options, e.g. ``channel_options(retry_service_config())``.
        balancing: ``auto`` (``round_robin`` for ``dns:``/``ipv4:``/``ipv6:`` targets, else
            ``pick_first``), ``round_robin``, ``pick_first`` or ``prefix_affinity`` (Generate
            streams placed on a bounded-load consistent-hash ring by prompt prefix; unary
            calls round-robin). See ``balancing.py``.
        affinity_prefix_tokens: ``prefix_affinity`` keys on about this many leading prompt
            tokens (or on the system message).
        affinity_epsilon: ``prefix_affinity`` sends a request elsewhere when its replica is over
            ``(1 + epsilon)`` x the mean in-flight count.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        channel: grpc.Channel | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        metadata: Sequence[tuple[str, str]] | None = None,
        options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        balancing: str = "auto",
        affinity_prefix_tokens: int = 64,
        affinity_epsilon: float = 0.25,
    ) -> None:
        target = target or DEFAULT_TARGET
        mode = balancing_mode(balancing, target)
        self._owns_channel = channel is None
        self.channel = channel or make_channel(target, credentials, balanced_options(mode, options))
        self.pool: AffinityPool | None = None
        if mode == "prefix_affinity" and channel is None:
            self.pool = AffinityPool(
                target,
                options=options,
                epsilon=affinity_epsilon,
                channel_factory=lambda address, opts: make_channel(address, credentials, opts),
            )
        self.affinity_prefix_tokens = affinity_prefix_tokens
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.metadata = with_token(metadata, token)
        self._stub = pb_grpc.InferenceServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._registry = StreamRegistry()
        # Batch jobs (inference.v1.BatchService): submit/get/cancel/list/watch/wait/results.
        self.batches = BatchApi(self.channel, self.retry, self.metadata, timeout)

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def open_stream(self, *, timeout: float | None = None) -> GenerateStream:
        """Open an empty multiplexed Generate stream; ``submit`` requests, then ``close`` it.

        With ``prefix_affinity`` the stream goes to the least loaded replica.
        """
        return self._open(None, timeout)

    def _open(self, key: bytes | None, timeout: float | None) -> GenerateStream:
        stub = self._stub if self.pool is None else self.pool.picking_stub(key)
        return GenerateStream(
            stub,
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
    ) -> Generation:
        """Stream one generation: ``Delta`` events, then ``Done``.

        Pass exactly one of ``prompt`` and ``messages``. ``options`` are the
        sampling fields, ``priority`` ("interactive"/"batch") and at most one
        output constraint (``json_schema``, ``regex``, ``lark_grammar``,
        ``gbnf_grammar``). The returned :class:`Generation` is an iterator with
        ``cancel()``; ``client.cancel(request_id)`` works too.
        """
        spec = RequestSpec(prompt=prompt, messages=messages, request_id=request_id, **options)
        key = None
        if self.pool is not None:
            key = prefix_key(prompt, messages, k_tokens=self.affinity_prefix_tokens)
        stream = self._open(key, timeout)
        rid = stream.submit(spec)
        stream.close()
        return Generation(stream, rid)

    def generate_many(
        self,
        requests: Iterable[RequestSpec | str],
        *,
        timeout: float | None = None,
        **options: Unpack[GenerateOptions],
    ) -> GenerateStream:
        """Send many requests on ONE Generate stream.

        Bare prompts take ``options``; ``RequestSpec`` items are used as given.
        Iterate the result for interleaved ``(request_id, event)`` pairs (a
        failed request yields an ``ErrorEvent``), or call ``collect()`` for a
        ``{request_id: Result}`` dict. ``request_ids`` lists the ids in order.
        """
        stream = self.open_stream(timeout=timeout)
        try:
            for item in requests:
                stream.submit(RequestSpec(prompt=item, **options) if isinstance(item, str) else item)
        except BaseException:
            stream.abort()
            raise
        stream.close()
        return stream

    def cancel(self, request_id: str) -> bool:
        """Cancel an in-flight request of any of this client's streams; False if none has it."""
        stream = self._registry.owner(request_id)
        return stream is not None and bool(stream.cancel(request_id))

    def generate_json_response(
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
        return call_with_retry(
            lambda t: self._stub.GenerateJSON(request, timeout=t, metadata=self.metadata),
            self.retry,
            self._timeout(timeout),
        )

    def generate_json(
        self,
        schema: Mapping[str, Any] | str,
        prompt: str | None = None,
        messages: Sequence[MessageLike] | None = None,
        *,
        timeout: float | None = None,
        **options: Unpack[SamplingOptions],
    ) -> Any:
        """Generate one JSON document valid against ``schema`` (a dict or JSON text); return it parsed.

        The result is a dict for object schemas (any JSON value in general).
        """
        resp = self.generate_json_response(schema, prompt, messages, timeout=timeout, **options)
        return json.loads(resp.json)

    def metrics(self, *, timeout: float | None = None) -> pb.GetMetricsResponse:
        """The engine's metrics snapshot (``metrics_to_dict`` turns it into a dict)."""
        return call_with_retry(
            lambda t: self._stub.GetMetrics(pb.GetMetricsRequest(), timeout=t, metadata=self.metadata),
            self.retry,
            self._timeout(timeout),
        )

    def metrics_dict(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The metrics snapshot as a plain dict (proto field names, enums as names)."""
        return metrics_to_dict(self.metrics(timeout=timeout))

    def tokenize(
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
        return self._unary(self._stub.Tokenize, request, timeout)

    def count_tokens(
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
        return self._unary(self._stub.CountTokens, request, timeout)

    def detokenize(
        self, token_ids: Sequence[int], *, render_special: bool = False, timeout: float | None = None
    ) -> pb.DetokenizeResponse:
        """The text (and exact bytes) of ``token_ids``."""
        return self._unary(self._stub.Detokenize, detokenize_request(token_ids, render_special), timeout)

    def model_info(self, *, timeout: float | None = None) -> pb.GetModelInfoResponse:
        """The served model, its limits and the request options it accepts (``model_info_to_dict``)."""
        return self._unary(self._stub.GetModelInfo, pb.GetModelInfoRequest(), timeout)

    def _unary(self, method: Any, request: Any, timeout: float | None) -> Any:
        return call_with_retry(
            lambda t: method(request, timeout=t, metadata=self.metadata), self.retry, self._timeout(timeout)
        )

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """grpc.health.v1 status of ``service`` ("" = the server): "SERVING", "NOT_SERVING", ..."""
        request = health_pb2.HealthCheckRequest(service=service)
        resp = call_with_retry(
            lambda t: self._health.Check(request, timeout=t, metadata=self.metadata),
            self.retry,
            self._timeout(timeout),
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

    def submit_batch(self, items: Iterable[Any], **options: Any) -> Any:
        """Upload a batch job (items: BatchItem protos, OpenAI batch-input dicts or simple dicts); see ``batch.py``."""
        return self.batches.submit(items, **options)

    def wait_batch(self, batch_id: str, on_progress: Any = None) -> Any:
        """Block until the job is final (COMPLETED, FAILED, CANCELLED or EXPIRED); returns the Batch."""
        return self.batches.wait(batch_id, on_progress)

    def batch_results(self, batch_id: str, *, order: str = "custom_id", cursor: str = "") -> Any:
        """Iterate the finished items' results (``order`` "custom_id" or "completion"), resuming on failures."""
        return self.batches.results(batch_id, order=order, cursor=cursor)

    def close(self) -> None:
        """Close the channel if the client created it (and the per-replica channels of ``prefix_affinity``)."""
        if self._owns_channel:
            self.channel.close()
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
