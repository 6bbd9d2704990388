"""Observability with the real model and real servers: health, GetMetrics, OTel traces and metrics, logs.

Dedicated servers (their own loop threads) are used where the test changes
server state (health across start and drain) or needs its own telemetry; the
GetMetrics test uses the shared session server and compares deltas.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import socket
import threading
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from service.__main__ import JsonFormatter, TextFormatter
from service.config import ServerConfig
from service.observability.setup import make_telemetry, start_prometheus
from service.observability.telemetry import OTelTelemetry, Telemetry
from service.server import SERVICE_NAME, InferenceServer
from tests.support.helpers import OpenStream, preempt_reject_cancel, req, run_stream, wait_for
from tests.support.server import DEFAULT_MODEL, RunningServer, server_config, wait_idle

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
TRACE_ID, PARENT_ID = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
TRACEPARENT = (("traceparent", f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"),)


config = server_config


class LoopServer:
    """An InferenceServer with the given telemetry on its own event-loop thread (not started)."""

    def __init__(self, cfg: ServerConfig, telemetry: Telemetry | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = InferenceServer(cfg, telemetry)

    def call(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tracing_off_is_the_noop_base(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    telemetry = make_telemetry(ServerConfig(http_port=0))
    assert type(telemetry) is Telemetry and not telemetry.enabled
    assert telemetry.server_interceptors() == []
    served = make_telemetry(ServerConfig())  # the HTTP API (on by default) serves the metrics at /metrics
    try:
        assert served.prometheus_registry is not None
    finally:
        served.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert type(make_telemetry(ServerConfig())) is Telemetry


def test_make_telemetry_follows_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    console = make_telemetry(ServerConfig(trace_console=True))
    assert isinstance(console, OTelTelemetry) and console.enabled and len(console.server_interceptors()) == 1
    console.shutdown()
    port = free_port()
    metrics_only = make_telemetry(ServerConfig(prometheus_port=port))
    assert isinstance(metrics_only, OTelTelemetry) and not metrics_only.enabled
    assert metrics_only.server_interceptors() == []
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).status == 200
    metrics_only.shutdown()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


# -- health ------------------------------------------------------------------------------------
def _watch(channel: grpc.Channel, out: queue.Queue[int]) -> None:
    try:
        for resp in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="")):
            out.put(resp.status)
    except grpc.RpcError:
        out.put(-1)  # the stream ended (server stopped)


def _statuses(channel: grpc.Channel) -> set[int]:
    stub = health_pb2_grpc.HealthStub(channel)
    return {
        stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=10, wait_for_ready=True).status
        for s in ("", SERVICE_NAME)
    }


@pytest.mark.model
def test_health_not_serving_while_loading_and_draining() -> None:
    srv = LoopServer(config())
    gate, load = threading.Event(), srv.server._load
    srv.server._load = lambda loop: (gate.wait(60), load(loop))[1]  # type: ignore[method-assign]
    started = asyncio.run_coroutine_threadsafe(srv.server.start(), srv.loop)
    assert wait_for(lambda: bool(srv.server.port), timeout=30), "the port was never bound"
    seen: queue.Queue[int] = queue.Queue()
    with grpc.insecure_channel(srv.target) as ch:
        assert _statuses(ch) == {NOT_SERVING}
        threading.Thread(target=_watch, args=(ch, seen), daemon=True).start()
        assert seen.get(timeout=600) == NOT_SERVING
        stub = pb_grpc.InferenceServiceStub(ch)
        for call in (
            lambda: run_stream(ch, [req("early", "Hi", 2)]),
            lambda: stub.GetMetrics(pb.GetMetricsRequest()),
            lambda: stub.Tokenize(pb.TokenizeRequest(text="Hi")),
            lambda: stub.GetModelInfo(pb.GetModelInfoRequest()),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "loading" in str(err.value.details())
        gate.set()
        started.result(120)
        assert seen.get(timeout=600) == SERVING and _statuses(ch) == {SERVING}
        assert run_stream(ch, [req("ok", "Hi", 2)])["ok"].done is not None
        srv.call(srv.server.drain(1.0))
        assert seen.get(timeout=600) == NOT_SERVING and _statuses(ch) == {NOT_SERVING}
        with pytest.raises(grpc.RpcError) as err:
            run_stream(ch, [req("late", "Hi", 2)])
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in str(err.value.details())
        srv.close()
        assert seen.get(timeout=600) == -1 and seen.empty()


# -- GetMetrics ----------------------------------------------------------------------------------
def _tier(m: pb.GetMetricsResponse, priority: int) -> pb.TierMetrics:
    return next(t for t in m.tiers if t.priority == priority)


@pytest.mark.model
def test_get_metrics_agree_with_traffic(server: RunningServer, channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    wait_idle(server)
    before = stub.GetMetrics(pb.GetMetricsRequest())
    stream = OpenStream(channel)
    stream.send(req("m-cancel", "Write a long essay about the sea.", 500, ignore_eos=True))
    assert stream.next_event().WhichOneof("event") == "delta"
    stream.send(pb.GenerateRequest(request_id="m-cancel", cancel=True))
    for i in range(3):
        stream.send(req(f"m-i{i}", f"Count to {i + 3}:", 8, ignore_eos=True))
    for i in range(2):
        stream.send(req(f"m-b{i}", f"List {i + 2} colours:", 6, ignore_eos=True, priority=pb.PRIORITY_BATCH))
    stream.send(req("m-bad", "", 4))  # rejected as INVALID_ARGUMENT: never accepted, not counted
    stream.close()
    stream.join()
    events = list(stream.events.queue)
    dones = {e.request_id: e.done for e in events if e.WhichOneof("event") == "done"}
    assert len(dones) == 6 and dones["m-cancel"].finish_reason == pb.FINISH_REASON_CANCELLED
    wait_idle(server)
    after = stub.GetMetrics(pb.GetMetricsRequest())
    _assert_deltas(before, after, dones)


def _assert_deltas(before: Any, after: Any, dones: dict[str, pb.Done]) -> None:
    """``after`` - ``before`` (GetMetrics responses) accounts for exactly the requests in ``dones``."""
    inter = (_tier(before, pb.PRIORITY_INTERACTIVE), _tier(after, pb.PRIORITY_INTERACTIVE))
    batch = (_tier(before, pb.PRIORITY_BATCH), _tier(after, pb.PRIORITY_BATCH))
    for (b, a), (total, completed, cancelled) in ((inter, (4, 3, 1)), (batch, (2, 2, 0))):
        assert a.requests_total - b.requests_total == total
        assert a.requests_completed - b.requests_completed == completed
        assert a.requests_cancelled - b.requests_cancelled == cancelled
        assert (a.requests_failed, a.requests_rejected) == (b.requests_failed, b.requests_rejected)
        assert a.running == a.waiting == 0
        if a.ttft.count < 2000:  # latency windows keep the last 2048 observations
            assert a.ttft.count - b.ttft.count == total and a.e2e.count - b.e2e.count == completed
    assert after.requests_total - before.requests_total == 6
    prompt = sum(d.usage.prompt_tokens for d in dones.values())
    assert after.prompt_tokens_total - before.prompt_tokens_total == prompt
    generated = sum(d.usage.completion_tokens for d in dones.values())
    assert after.generated_tokens_total - before.generated_tokens_total == generated
    assert sum(d.usage.completion_tokens for k, d in dones.items() if k != "m-cancel") == 3 * 8 + 2 * 6
    steps = {b.sequences: b.steps for b in before.batch_sizes}
    grown = sum(b.steps - steps.get(b.sequences, 0) for b in after.batch_sizes)
    assert grown == after.engine_steps_total - before.engine_steps_total > 0
    _assert_step_phases(before, after)


def _assert_step_phases(before: Any, after: Any) -> None:
    """Every decode step is timed once, and llama.cpp's share and the Python phases all grew."""
    b, a = before.step_phases, after.step_phases
    assert a.steps - b.steps == after.engine_steps_total - before.engine_steps_total
    assert set(a.seconds_total) == {"plan", "batch", "decode", "sample", "update", "emit"}
    grown = {k: a.seconds_total[k] - b.seconds_total.get(k, 0.0) for k in a.seconds_total}
    assert all(v > 0 for v in grown.values()), grown
    kv = after.kv
    assert kv.blocks_used == 0 and kv.blocks_used + kv.blocks_cached + kv.blocks_free == kv.blocks_total
    assert after.uptime_s > before.uptime_s and after.model == DEFAULT_MODEL.name


# -- traces and OTel metrics -----------------------------------------------------------------------
class Traced:
    """A dedicated server whose telemetry exports to memory (spans, metrics) and to Prometheus."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metrics = InMemoryMetricReader()
        self.prometheus_port = free_port()
        prometheus, close = start_prometheus("127.0.0.1", self.prometheus_port)
        meter_provider = MeterProvider(metric_readers=[self.metrics, prometheus])
        self.telemetry = OTelTelemetry(tracer_provider, meter_provider, [close])
        # One running sequence and a batch queue of one: preemption and rejection are easy to provoke.
        self.srv = LoopServer(config(max_running=1, queue_limit_batch=1), self.telemetry)
        self.srv.call(self.srv.server.start())

    def spans_of(self, trace_id: int) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if s.context.trace_id == trace_id]


@pytest.fixture(scope="module")
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.srv.close()


def _request_span(spans: list[Any], rid: str) -> Any:
    return next(s for s in spans if s.attributes.get("inference.request_id") == rid)


@pytest.mark.model
def test_request_span_is_child_of_rpc_span_of_caller_trace(traced: Traced) -> None:
    with grpc.insecure_channel(traced.srv.target) as ch:
        request = req("t1", "The sky is", 5, ignore_eos=True, top_p=0.9, seed=7)
        res = run_stream(ch, [request], metadata=TRACEPARENT)
    done: Any = res["t1"].done
    # the RPC span ends just after the last response
    assert wait_for(lambda: any(s.kind is SpanKind.SERVER for s in traced.spans_of(TRACE_ID)), timeout=600)
    spans = traced.spans_of(TRACE_ID)
    rpc = next(s for s in spans if s.kind is SpanKind.SERVER)
    assert rpc.name == "/inference.v1.InferenceService/Generate" and rpc.parent.span_id == PARENT_ID
    span = _request_span(spans, "t1")
    assert span.kind is SpanKind.INTERNAL and span.parent.span_id == rpc.context.span_id
    assert span.name == f"text_completion {DEFAULT_MODEL.name}"
    a: Any = span.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"]) == ("text_completion", DEFAULT_MODEL.name)
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"]) == (5, 0.0)
    assert a["gen_ai.request.top_p"] == pytest.approx(0.9) and a["gen_ai.request.seed"] == 7
    assert a["gen_ai.usage.input_tokens"] == done.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == done.usage.completion_tokens == 5
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("length",)
    assert a["inference.priority"] == "interactive" and span.status.status_code is StatusCode.UNSET
    assert [e.name for e in span.events] == ["queued", "scheduled", "first_token", "finished"]
    times = [e.timestamp for e in span.events]
    assert times == sorted(times) and span.start_time <= times[0] and times[-1] <= span.end_time


@pytest.mark.model
def test_preemption_rejection_and_cancellation_are_traced(traced: Traced) -> None:
    with grpc.insecure_channel(traced.srv.target) as ch:
        finals = preempt_reject_cancel(ch)
    assert finals["refused"].error.status == "RESOURCE_EXHAUSTED"
    spans: dict[Any, Any] = {
        s.attributes.get("inference.request_id"): s  # type: ignore[union-attr]
        for s in traced.spans.get_finished_spans()
    }
    long = spans["long"]
    names = [e.name for e in long.events]
    assert names[:3] == ["queued", "scheduled", "first_token"] and names[-1] == "cancelled", names
    assert "preempted" in names and long.attributes["inference.preemptions"] >= 1
    assert tuple(long.attributes["gen_ai.response.finish_reasons"]) == ("cancelled",)
    refused = spans["refused"]
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.attributes["error.type"] == "RESOURCE_EXHAUSTED"
    assert [e.name for e in refused.events] == ["queued", "failed"]
    assert [e.name for e in spans["urgent"].events][-1] == "finished"


@pytest.mark.model
def test_request_log_lines_carry_request_and_trace_ids(traced: Traced, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, logger="service.request")
    with grpc.insecure_channel(traced.srv.target) as ch:
        run_stream(ch, [req("logged", "Hi", 2)], metadata=TRACEPARENT)
    finished = [r for r in caplog.records if r.getMessage().startswith("request finished")]
    record = next(r for r in finished if getattr(r, "request_id", None) == "logged")
    assert getattr(record, "trace_id", None) == f"{TRACE_ID:032x}"
    assert '"request_id": "logged"' in JsonFormatter().format(record)
    assert f"trace_id={TRACE_ID:032x}" in TextFormatter().format(record)


def wait_idle_loop(traced: Traced) -> None:
    """The dedicated server has no request left (its engine is idle)."""
    assert wait_for(lambda: not traced.srv.server.engine.scheduler.has_work(), timeout=30)


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data: Any = reader.get_metrics_data()
    return {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


@pytest.mark.model
def test_otel_and_prometheus_metrics_match_get_metrics(traced: Traced) -> None:
    with grpc.insecure_channel(traced.srv.target) as ch:
        run_stream(ch, [req(f"p{i}", "Numbers:", 4, ignore_eos=True) for i in range(3)])
        wait_idle_loop(traced)
        m = pb_grpc.InferenceServiceStub(ch).GetMetrics(pb.GetMetricsRequest())
    inter = _tier(m, pb.PRIORITY_INTERACTIVE)

    def accepted_now() -> Any:
        return {p.attributes["inference.priority"]: p.value for p in _points(traced.metrics)["inference.requests.accepted"]}

    # the OTel view reads a snapshot cached for otel_metrics.SNAPSHOT_TTL_S: wait for a fresh one
    assert wait_for(lambda: accepted_now().get("interactive") == inter.requests_total, timeout=600)
    points = _points(traced.metrics)
    accepted = {p.attributes["inference.priority"]: p.value for p in points["inference.requests.accepted"]}
    assert accepted["interactive"] == inter.requests_total
    assert points["inference.generated_tokens"][0].value == m.generated_tokens_total
    blocks = {p.attributes["inference.kv.state"]: p.value for p in points["inference.kv.blocks"]}
    assert sum(blocks.values()) == m.kv.blocks_total
    ttft = [
        p
        for p in points["gen_ai.server.time_to_first_token"]
        if p.attributes["inference.priority"] == "interactive"
    ]
    assert ttft[0].count == inter.ttft.count
    url = f"http://127.0.0.1:{traced.prometheus_port}/metrics"

    def scraped_accepted() -> tuple[float, str]:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        line = next(
            x
            for x in text.splitlines()
            if x.startswith("inference_requests_accepted_total{") and 'inference_priority="interactive"' in x
        )
        return float(line.rsplit(" ", 1)[1]), text

    assert wait_for(lambda: scraped_accepted()[0] == inter.requests_total, timeout=600), scraped_accepted()[0]
    text = scraped_accepted()[1]
    assert "gen_ai_server_request_duration_seconds_bucket" in text



# -- OTLP round trip ---------------------------------------------------------------------------------
class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """A minimal OTLP/gRPC trace receiver."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.mark.model
def test_spans_reach_an_otlp_receiver_with_the_callers_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    collector, receiver = Collector(), grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, receiver)
    port = receiver.add_insecure_port("127.0.0.1:0")
    receiver.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "otlp-test")
    telemetry = make_telemetry(config())
    assert telemetry.enabled
    srv = LoopServer(config(), telemetry)
    try:
        srv.call(srv.server.start())
        with grpc.insecure_channel(srv.target) as ch:
            assert run_stream(ch, [req("otlp", "Hi", 3)], metadata=TRACEPARENT)["otlp"].done is not None
    finally:
        srv.close()  # shuts the telemetry down: flushes the batch processor
        receiver.stop(1)
    spans = {
        s.name: (rs, s)
        for r in collector.requests
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }
    rs, rpc = spans["/inference.v1.InferenceService/Generate"]
    _, span = spans[f"text_completion {DEFAULT_MODEL.name}"]
    assert rpc.trace_id == span.trace_id == TRACE_ID.to_bytes(16, "big")
    assert rpc.parent_span_id == PARENT_ID.to_bytes(8, "big") and span.parent_span_id == rpc.span_id
    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
    assert resource["service.name"] == "otlp-test"
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["inference.request_id"].string_value == "otlp"
    assert attrs["gen_ai.usage.output_tokens"].int_value > 0
