"""Scenario G — tracing overhead: throughput with OTLP trace export vs tracing off.

Two ``python -m service`` processes on the same model: one with tracing off
(the no-op telemetry), one exporting every span with the real OTLP/gRPC
exporter (BatchSpanProcessor) to a receiver inside this process. The same
closed-loop load (``streams`` concurrent Generate streams, each sending
``requests`` greedy requests of ``max_tokens`` tokens one after another) runs
against each, alternating off/on for ``rounds`` rounds so drifting machine load
hits both alike; the median tok/s of each side gives the overhead.

Also reported: the cost of the telemetry hooks themselves, timed in-process
per request (span start, engine-thread events, span end with a batch export),
which bounds the overhead independently of the (noisy) end-to-end figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import channel, closed_loop, summarize
from bench.harness.procs import GrpcServer, environment
from bench.harness.tables import table

FULL = {"streams": 8, "requests": 4, "max_tokens": 64, "rounds": 5}
QUICK = {"streams": 4, "requests": 1, "max_tokens": 16, "rounds": 1}
PROMPT = "Write a short paragraph about the history of tea."


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that counts what it gets."""

    def __init__(self) -> None:
        self.spans = 0
        self.exports = 0

    def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        self.exports += 1
        self.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.contextmanager
def receiver() -> Iterator[tuple[Receiver, int]]:
    rec, server = Receiver(), grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(rec, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield rec, port
    finally:
        server.stop(1)


async def _trial(target: str, load: dict[str, int]) -> dict[str, Any]:
    ch = channel(target)
    try:
        prompts = [[f"{PROMPT} ({s}.{r})" for r in range(load["requests"])] for s in range(load["streams"])]
        t0 = time.perf_counter()
        results = await closed_loop(ch, prompts, load["max_tokens"])
        return summarize(results, time.perf_counter() - t0)
    finally:
        await ch.close()


def hook_cost_us(n: int = 2000) -> float:
    """Microseconds of telemetry work per request with a real SDK pipeline (batch processor, no network)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from service.observability.telemetry import OTelTelemetry
    from service.request.events import Done
    from service.request.sequence import FinishReason, SamplingParams, Sequence

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    tel = OTelTelemetry(provider)
    seqs = [Sequence(f"r{i}", list(range(20)), SamplingParams(max_tokens=64)) for i in range(n)]
    t0 = time.perf_counter()
    for seq in seqs:
        tel.on_submit(seq)
        tel.on_scheduled(seq)
        tel.on_first_token(seq)
        seq.finish_reason = FinishReason.LENGTH
        tel.on_finish(seq, Done.of(seq))
    elapsed = time.perf_counter() - t0
    tel.shutdown()
    return elapsed / n * 1e6


def _measure(servers: dict[str, GrpcServer], load: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    trials: dict[str, list[dict[str, Any]]] = {k: [] for k in servers}
    for srv in servers.values():  # warm-up, not counted
        asyncio.run(_trial(srv.target, {**load, "requests": 1}))
    for r in range(load["rounds"]):
        order = list(servers) if r % 2 == 0 else list(reversed(servers))
        for name in order:
            res = asyncio.run(_trial(servers[name].target, load))
            say(f"  round {r + 1}/{load['rounds']} tracing {name}: {res['tok_s']:.1f} tok/s")
            trials[name].append(res)
    return trials


def _trials(model_path: str, load: dict[str, int]) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Both servers' trials and the spans the receiver got (the on server flushes them as it stops)."""
    with receiver() as (rec, port):
        off = GrpcServer("tracing_off", model_path)
        on = GrpcServer("tracing_on", model_path)
        with environment(OTEL_EXPORTER_OTLP_ENDPOINT=None, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=None):
            off.start()
        try:
            endpoint = f"http://127.0.0.1:{port}"
            with environment(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_METRICS_EXPORTER="none"):
                on.start()
            trials = _measure({"off": off, "on": on}, load)
        finally:
            off.stop()
            on.stop()  # SIGTERM: the server flushes its spans before exiting
        return trials, rec.spans


def trace_overhead(model_path: str, quick: bool = False) -> dict[str, Any]:
    """Tok/s tracing off vs on (OTLP export), the overhead % and the hook cost."""
    load = QUICK if quick else FULL
    trials, spans = _trials(model_path, load)
    median = {k: statistics.median(t["tok_s"] for t in v) for k, v in trials.items()}
    requests = sum(t["completed"] for t in trials["on"])
    out: dict[str, Any] = {
        "load": load,
        "tok_s_off": median["off"],
        "tok_s_on": median["on"],
        "overhead_pct": (median["off"] - median["on"]) / median["off"] * 100.0,
        "trials_tok_s": {k: [round(t["tok_s"], 2) for t in v] for k, v in trials.items()},
        "failed_requests": sum(t["failed"] for v in trials.values() for t in v),
        "spans_exported": spans,
        "spans_expected_min": requests,
        "hook_us_per_request": hook_cost_us(200 if quick else 2000),
        "target_overhead_pct": 1.0,
    }
    if quick:
        out["note"] = "quick: one short trial per side; the overhead figure is noise, not a measurement"
    say(
        f"  tracing off {median['off']:.1f} tok/s, on {median['on']:.1f} tok/s: "
        f"overhead {out['overhead_pct']:+.2f}% ({spans} spans exported); hooks "
        f"{out['hook_us_per_request']:.0f} us/request"
    )
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    # NOTE: its servers take --threads from the environment (service/config.py)
    threads = {"INFERENCE_THREADS": str(cfg.threads)} if cfg.threads else {}
    with environment(**threads):
        return trace_overhead(str(cfg.model), quick=cfg.quick)


# -- summary.md ------------------------------------------------------------------------------------
def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, dict | list):
        return json.dumps(v, default=str)
    return str(v)


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario G: one row per measure."""
    if isinstance(r.get("markdown"), str):
        return str(r["markdown"])
    return table(["measure", "value"], [[k.replace("_", " "), _cell(v)] for k, v in r.items()])


if __name__ == "__main__":  # pragma: no cover - manual run
    import sys

    from bench.harness.config import DEFAULT_MODEL

    print(
        json.dumps(
            trace_overhead(sys.argv[1] if len(sys.argv) > 1 else str(DEFAULT_MODEL), quick=True), indent=2
        )
    )
