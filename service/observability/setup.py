"""Chooses the telemetry implementation from the configuration and the standard OTel env vars.

* Traces: exported with OTLP/gRPC when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and ``OTEL_TRACES_EXPORTER``
  does not exclude ``otlp``; printed to stdout with ``--trace-console``.
  Sampling, batching, headers, timeouts: the SDK's own ``OTEL_*`` variables.
* Metrics: served for Prometheus on ``--prometheus-port`` and at ``/metrics``
  of the HTTP API (``--http-port``; one registry, ``Telemetry.prometheus_registry``,
  behind both); exported with OTLP/gRPC when an OTLP endpoint is set and
  ``OTEL_METRICS_EXPORTER`` does not exclude ``otlp``.
* ``OTEL_SDK_DISABLED=true`` or none of the above: the no-op ``Telemetry``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from service.observability.telemetry import OTelTelemetry, Telemetry

if TYPE_CHECKING:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import CollectorRegistry

log = logging.getLogger("service.telemetry")
DEFAULT_SERVICE_NAME = "inference-server"


class TelemetrySettings(Protocol):
    """What telemetry needs of the server's flags (``ServerConfig`` has them)."""

    @property
    def host(self) -> str: ...  # the Prometheus endpoint's address
    @property
    def prometheus_port(self) -> int: ...  # 0: no Prometheus endpoint
    @property
    def trace_console(self) -> bool: ...  # print spans to stdout
    @property
    def http_port(self) -> int: ...  # 0: no HTTP API (whose /metrics also serves the registry)


def _wants_otlp(env: Mapping[str, str], signal: str) -> bool:
    """An OTLP endpoint is configured for ``signal`` ("TRACES"/"METRICS") and its exporter is otlp."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    exporters = env.get(f"OTEL_{signal}_EXPORTER", "otlp").replace(" ", "").split(",")
    return bool(endpoint) and "otlp" in exporters


def make_resource() -> Resource:
    """Resource from ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``; service.name defaults here."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def make_tracer_provider(resource: Resource, otlp: bool, console: bool) -> TracerProvider | None:
    """A TracerProvider with batch processors for the chosen exporters, or None if none is chosen."""
    if not (otlp or console):
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=resource)
    if otlp:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if console:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return provider


def start_prometheus(
    host: str, port: int, registry: CollectorRegistry | None = None
) -> tuple[PrometheusMetricReader, Callable[[], None]]:
    """A Prometheus reader on ``registry`` (default: its own), served at http://host:port/metrics;
    (reader, closer)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry() if registry is None else registry
    reader = PrometheusMetricReader(registry=registry)
    httpd, thread = start_http_server(port, addr=host, registry=registry)

    def close() -> None:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)

    return reader, close


def make_meter_provider(
    resource: Resource, otlp: bool, prometheus: tuple[str, int] | None, registry: CollectorRegistry | None = None
) -> tuple[MeterProvider | None, list[Callable[[], None]]]:
    """A MeterProvider with the chosen readers (or None) and the closers they need.

    ``registry`` (a prometheus_client CollectorRegistry) gets a Prometheus reader
    too; the Prometheus port, when there is one, serves that same registry.
    """
    readers: list[MetricReader] = []
    closers: list[Callable[[], None]] = []
    if prometheus is not None:
        reader, close = start_prometheus(*prometheus, registry=registry)
        readers.append(reader)
        closers.append(close)
    elif registry is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader(registry=registry))
    if otlp:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if not readers:
        return None, closers
    from opentelemetry.sdk.metrics import MeterProvider

    return MeterProvider(metric_readers=readers, resource=resource), closers


def make_telemetry(config: TelemetrySettings) -> Telemetry:
    """The telemetry for ``config`` and the environment; the no-op base when all is off.

    Starts the Prometheus HTTP server when ``config.prometheus_port`` is set
    (raises OSError if the port is taken); ``Telemetry.shutdown`` stops it.
    """
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return Telemetry()
    if env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc") != "grpc":
        log.warning("only OTLP over gRPC is supported; ignoring OTEL_EXPORTER_OTLP_PROTOCOL")
    traces_otlp, metrics_otlp = _wants_otlp(env, "TRACES"), _wants_otlp(env, "METRICS")
    prometheus = (config.host, config.prometheus_port) if config.prometheus_port else None
    if not (traces_otlp or metrics_otlp or config.trace_console or prometheus or config.http_port):
        return Telemetry()
    from prometheus_client import CollectorRegistry

    # NOTE: the HTTP API's /metrics serves today's metrics from this registry (no port of its own)
    registry = CollectorRegistry() if (prometheus or config.http_port) else None
    resource = make_resource()
    tracer_provider = make_tracer_provider(resource, traces_otlp, config.trace_console)
    meter_provider, closers = make_meter_provider(resource, metrics_otlp, prometheus, registry)
    log.info(
        "telemetry: traces otlp=%s console=%s; metrics otlp=%s prometheus=%s http /metrics=%s",
        traces_otlp,
        config.trace_console,
        metrics_otlp,
        f"http://{config.host}:{config.prometheus_port}/metrics" if prometheus else "off",
        "on" if config.http_port else "off",
    )
    return OTelTelemetry(tracer_provider, meter_provider, closers, registry)
