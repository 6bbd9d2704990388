"""Request telemetry: OpenTelemetry traces and metrics, request log lines.

``Telemetry`` (the base) is what runs when tracing and metrics export are off:
its hooks do no tracing work at all, so the engine pays nothing (``enabled``
is False, which also skips the per-token hook). ``OTelTelemetry`` adds

* one span per request (``text_completion <model>``, kind INTERNAL), a child of
  the RPC span that the gRPC server interceptor opens from the caller's W3C
  ``traceparent``; events ``queued``, ``scheduled``, ``first_token``,
  ``preempted``, ``cancelled``/``finished``/``failed``; GenAI attributes;
* GenAI server histograms and the GetMetrics figures (``service.observability.otel_metrics``).

Threads: ``on_submit``/``on_finish`` run on the event loop; ``on_scheduled``,
``on_first_token`` and ``on_preempted`` on the engine thread, where they only
add an event to the request's span (thread-safe in the SDK, no I/O).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind, Status, StatusCode

from service.request.events import Done, Error
from service.request.sequence import FinishReason, Sequence

if TYPE_CHECKING:
    import grpc
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue
    from prometheus_client import CollectorRegistry

    from service.observability.otel_metrics import RequestHistograms
    from service.observability.sources import EngineView, ResponseCacheView, TenantView
    from service.threads.adaptive import AdaptiveThreads

log = logging.getLogger("service.request")
OPERATION = "text_completion"
PROVIDER = "llama.cpp"


class Telemetry:
    """Per-request hooks; the no-op base used when tracing and metric export are off.

    The only work done here is request logging: DEBUG lines for accepted and
    finished requests, an INFO line for failed ones (DEBUG for queue-full
    rejections), each carrying ``request_id`` (and ``trace_id``/``span_id``
    when tracing) as record attributes.
    """

    enabled = False  # True: the engine calls the per-token hook (on_first_token)
    prometheus_registry: CollectorRegistry | None = None  # the metrics' registry (OTelTelemetry's argument)

    def observe(
        self,
        engine: EngineView,
        tenancy: TenantView | None = None,
        response_cache: ResponseCacheView | None = None,
        threads: AdaptiveThreads | None = None,
    ) -> None:
        """Called once the engine is built (before SERVING): what the metrics read. No-op here.

        The engine calls this object's hooks (``Engine(..., hooks=telemetry)``); this is the other
        direction, read-only: the engine's, tenants', response cache's and thread control's views.
        """
        return None

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """gRPC aio server interceptors to install (none when tracing is off)."""
        return []

    def log_fields(self, seq: Sequence) -> dict[str, str]:
        """``extra=`` for request log lines: request_id, tenant, and trace_id/span_id when traced."""
        return {"request_id": seq.request_id, "tenant": seq.tenant}

    def on_submit(self, seq: Sequence) -> None:
        """Event loop thread: the request was validated and is about to be queued."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request accepted: priority=%s prompt_tokens=%d max_tokens=%d",
                seq.priority.name.lower(),
                seq.num_prompt_tokens,
                seq.params.max_tokens,
                extra=self.log_fields(seq),
            )

    def on_finish(self, seq: Sequence, event: Done | Error) -> None:
        """Event loop thread: the request's final event (Done or Error) was produced.

        Also called with an Error when ``submit`` refused the request after
        ``on_submit`` (queue full, draining). Called at most once per request.
        """
        if isinstance(event, Error):
            # Queue-full rejections come in floods under overload: counted in the metrics, logged at DEBUG.
            level = logging.DEBUG if event.status == "RESOURCE_EXHAUSTED" else logging.INFO
            if log.isEnabledFor(level):
                log.log(
                    level, "request failed: %s: %s", event.status, event.message, extra=self.log_fields(seq)
                )
        elif log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request finished: reason=%s prompt_tokens=%d completion_tokens=%d cached_tokens=%d "
                "queue_ms=%.1f ttft_ms=%.1f total_ms=%.1f preemptions=%d",
                event.finish_reason.value,
                event.prompt_tokens,
                event.completion_tokens,
                event.cached_tokens,
                event.queue_ms,
                event.ttft_ms,
                event.total_ms,
                event.preemptions,
                extra=self.log_fields(seq),
            )

    def cache_hit(self, seq: Sequence, hit: bool) -> None:
        """Event loop thread, after ``on_submit``: whether a cacheable request was answered from the cache."""
        return None

    # -- engine thread hooks: must be cheap; called between decodes --------------------------
    def on_scheduled(self, seq: Sequence) -> None:
        """The request left the queue and its prefill started (first time only)."""
        return None

    def on_first_token(self, seq: Sequence) -> None:
        """The first token was sampled (only called when ``enabled``)."""
        return None

    def on_preempted(self, seq: Sequence, reason: str) -> None:
        """The request was preempted; it will be recomputed when resumed."""
        return None

    def shutdown(self) -> None:
        """Flush and stop exporters (idempotent)."""
        return None


def _request_attributes(seq: Sequence, model: str) -> dict[str, AttributeValue]:
    p = seq.params
    attrs: dict[str, AttributeValue] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": p.max_tokens,
        "gen_ai.request.temperature": p.temperature,
        "gen_ai.request.top_p": p.top_p,
        "gen_ai.request.top_k": p.top_k,
        "gen_ai.request.stream": True,
        "gen_ai.usage.input_tokens": seq.num_prompt_tokens,
        "inference.request_id": seq.request_id,
        "inference.tenant": seq.tenant,  # the name, never the token
        "inference.priority": seq.priority.name.lower(),
        "inference.constrained": seq.matcher is not None,
    }
    if p.seed is not None:
        attrs["gen_ai.request.seed"] = p.seed
    if p.stop:
        attrs["gen_ai.request.stop_sequences"] = list(p.stop)
    return attrs


def _finish_reason(event: Done | Error) -> str:
    return event.finish_reason.value if isinstance(event, Done) else "error"


class OTelTelemetry(Telemetry):
    """OpenTelemetry traces (``tracer_provider``) and/or metrics (``meter_provider``).

    ``closers`` run at ``shutdown`` after the providers are flushed (e.g. the
    Prometheus HTTP server); ``registry`` is the prometheus_client registry the
    metrics are served from (``/metrics``, ``--prometheus-port``). Providers are
    used explicitly, never set global.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        closers: Iterable[Callable[[], None]] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.prometheus_registry = registry
        self.enabled = tracer_provider is not None
        self._tracer = tracer_provider.get_tracer("service.inference") if tracer_provider else None
        self._closers = list(closers)
        self._histograms: RequestHistograms | None = None
        self.model = ""
        self.span_name = OPERATION

    def observe(
        self,
        engine: EngineView,
        tenancy: TenantView | None = None,
        response_cache: ResponseCacheView | None = None,
        threads: AdaptiveThreads | None = None,
    ) -> None:
        self.model = engine.view().model.model
        self.span_name = f"{OPERATION} {self.model}"
        if self.meter_provider is not None:
            from service.observability.otel_metrics import RequestHistograms, observe_engine

            meter = self.meter_provider.get_meter("service.inference")
            observe_engine(meter, engine, tenancy, response_cache, threads)
            self._histograms = RequestHistograms(meter, self.model)

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        if self.tracer_provider is None:
            return []
        from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

        return [aio_server_interceptor(self.tracer_provider, filters.negate(filters.health_check()))]

    def log_fields(self, seq: Sequence) -> dict[str, str]:
        fields = {"request_id": seq.request_id, "tenant": seq.tenant}
        if seq.trace is not None:
            ctx = seq.trace.get_span_context()
            fields["trace_id"] = f"{ctx.trace_id:032x}"
            fields["span_id"] = f"{ctx.span_id:016x}"
        return fields

    def on_submit(self, seq: Sequence) -> None:
        if self._tracer is not None:
            attrs = _request_attributes(seq, self.model)
            span = self._tracer.start_span(self.span_name, kind=SpanKind.INTERNAL, attributes=attrs)
            span.add_event("queued", {"inference.priority": seq.priority.name.lower()})
            seq.trace = span
        super().on_submit(seq)

    def cache_hit(self, seq: Sequence, hit: bool) -> None:
        if seq.trace is not None:
            seq.trace.set_attribute("cache.hit", hit)

    def on_scheduled(self, seq: Sequence) -> None:
        span = seq.trace
        if span is not None:
            span.add_event("scheduled", {"inference.cached_tokens": seq.num_cached})

    def on_first_token(self, seq: Sequence) -> None:
        span = seq.trace
        if span is not None:
            span.add_event("first_token")

    def on_preempted(self, seq: Sequence, reason: str) -> None:
        span = seq.trace
        if span is not None:
            span.add_event(
                "preempted",
                {"inference.preemption.reason": reason, "inference.generated_tokens": seq.num_generated},
            )

    def on_finish(self, seq: Sequence, event: Done | Error) -> None:
        super().on_finish(seq, event)
        if self._histograms is not None:
            self._histograms.record(seq, event)
        span = seq.trace
        if span is None or not span.is_recording():
            return
        _end_span(span, seq, event)

    def shutdown(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.shutdown()
        self.tracer_provider = self.meter_provider = None
        self._tracer = self._histograms = None
        self.enabled = False
        closers, self._closers = self._closers, []
        for close in closers:
            close()


def _end_span(span: Span, seq: Sequence, event: Done | Error) -> None:
    """Final attributes, the closing event and the status; then end the span."""
    span.set_attributes(
        {
            "gen_ai.usage.output_tokens": seq.num_generated,
            "gen_ai.usage.cache_read.input_tokens": seq.num_cached,
            "gen_ai.response.finish_reasons": [_finish_reason(event)],
            "inference.preemptions": seq.preemptions,
        }
    )
    if isinstance(event, Done):
        span.set_attributes({"inference.queue_ms": event.queue_ms, "inference.ttft_ms": event.ttft_ms})
        name = "cancelled" if event.finish_reason is FinishReason.CANCELLED else "finished"
        span.add_event(name, {"gen_ai.response.finish_reasons": [event.finish_reason.value]})
    else:
        span.set_attribute("error.type", event.status)
        span.add_event("failed", {"error.type": event.status, "inference.error.message": event.message})
        span.set_status(Status(StatusCode.ERROR, f"{event.status}: {event.message}"))
    span.end()


__all__ = ["OTelTelemetry", "Telemetry"]
