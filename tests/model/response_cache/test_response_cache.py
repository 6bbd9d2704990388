"""Response cache on a real server with the default model: replay, policies, coalescing, GenerateJSON, restart."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.observability.telemetry import OTelTelemetry
from service.server import InferenceServer
from tests.support.helpers import EngineHold, OpenStream, Result, collect, req, run_stream, wait_for
from tests.support.server import RunningServer, server_config, start_server

pytestmark = pytest.mark.model
SCHEMA = '{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}'


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    db = tmp_path_factory.mktemp("rc") / "cache.db"
    srv = start_server(response_cache_bytes=1 << 20, response_cache_db=str(db))
    yield srv
    srv.close()


@pytest.fixture()
def stub(cached_server: RunningServer) -> Iterator[pb_grpc.InferenceServiceStub]:
    with grpc.insecure_channel(cached_server.target) as ch:
        yield pb_grpc.InferenceServiceStub(ch)


def _one(stub: pb_grpc.InferenceServiceStub, request: pb.GenerateRequest) -> Result:
    return collect(stub.Generate(iter([request]), timeout=600))[request.request_id]


def _cached(
    rid: str, prompt: str, policy: int = 0, max_tokens: int = 12, **sampling: Any
) -> pb.GenerateRequest:
    r = req(rid, prompt, max_tokens=max_tokens, **sampling)
    r.cache_policy = policy  # type: ignore[assignment]
    return r


def _engine_requests(srv: RunningServer) -> int:
    return int(sum(t["requests"] for t in srv.engine.metrics.snapshot()["tiers"].values()))


def test_a_repeated_greedy_request_is_replayed_without_the_engine(
    cached_server: RunningServer, stub: pb_grpc.InferenceServiceStub
) -> None:
    first = _one(stub, _cached("a", "The capital of France is"))
    before = _engine_requests(cached_server)
    again = _one(stub, _cached("b", "The capital of France is"))
    assert first.done is not None and again.done is not None
    assert not first.done.cache_hit and again.done.cache_hit
    assert (again.text, again.token_ids) == (first.text, first.token_ids) and first.token_ids
    assert again.done.finish_reason == first.done.finish_reason
    u = again.done.usage
    assert (u.prompt_tokens, u.completion_tokens) == (first.done.usage.prompt_tokens, len(first.token_ids))
    assert u.cached_tokens == u.prompt_tokens + u.completion_tokens
    assert _engine_requests(cached_server) == before  # the engine never saw the repeat


def test_stochastic_requests_are_never_cached_and_seeded_ones_are(stub: pb_grpc.InferenceServiceStub) -> None:
    runs = [_one(stub, _cached(f"s{i}", "Once upon a time", temperature=0.9)) for i in range(2)]
    assert all(r.done is not None and not r.done.cache_hit for r in runs)
    seeded = [_one(stub, _cached(f"z{i}", "Once upon a time", temperature=0.9, seed=42)) for i in range(2)]
    assert seeded[1].done is not None and seeded[1].done.cache_hit
    assert seeded[1].text == seeded[0].text


def test_policies_bypass_no_store_and_only_if_cached(stub: pb_grpc.InferenceServiceStub) -> None:
    missing = _one(stub, _cached("o", "Unseen prompt 1", pb.CACHE_POLICY_ONLY_IF_CACHED))
    assert missing.error is not None and missing.error.status == "NOT_FOUND" and missing.text == ""
    no_store = _one(stub, _cached("n", "Unseen prompt 1", pb.CACHE_POLICY_NO_STORE))
    assert no_store.done is not None and not no_store.done.cache_hit
    still_missing = _one(stub, _cached("o2", "Unseen prompt 1", pb.CACHE_POLICY_ONLY_IF_CACHED))
    assert still_missing.error is not None and still_missing.error.status == "NOT_FOUND"
    bypass = [_one(stub, _cached(f"b{i}", "Unseen prompt 2", pb.CACHE_POLICY_BYPASS)) for i in range(2)]
    assert all(r.done is not None and not r.done.cache_hit for r in bypass)  # never read...
    hit = _one(stub, _cached("h", "Unseen prompt 2", pb.CACHE_POLICY_ONLY_IF_CACHED))
    assert hit.done is not None and hit.done.cache_hit and hit.text == bypass[1].text  # ...but stored
    stochastic = _one(stub, _cached("x", "Unseen prompt 2", pb.CACHE_POLICY_ONLY_IF_CACHED, temperature=0.7))
    assert stochastic.error is not None and stochastic.error.status == "NOT_FOUND"
    bad = _one(stub, _cached("bad", "Unseen prompt 2", 7))
    assert bad.error is not None and bad.error.status == "INVALID_ARGUMENT"


def test_identical_requests_in_flight_are_computed_once(
    cached_server: RunningServer, stub: pb_grpc.InferenceServiceStub
) -> None:
    before = _engine_requests(cached_server)
    coalesced = stub.GetMetrics(pb.GetMetricsRequest()).response_cache.coalesced
    requests = [_cached(f"c{i}", "List three colours:", max_tokens=24) for i in range(3)]
    with grpc.insecure_channel(cached_server.target) as ch:
        results = run_stream(ch, requests, timeout=600)
    texts = {r.text for r in results.values()}
    assert len(texts) == 1 and all(r.done is not None for r in results.values())
    assert sum(r.done.cache_hit for r in results.values() if r.done) == 2
    assert _engine_requests(cached_server) == before + 1
    assert stub.GetMetrics(pb.GetMetricsRequest()).response_cache.coalesced == coalesced + 2


def test_generate_json_replays_the_stored_document(stub: pb_grpc.InferenceServiceStub) -> None:
    def ask(policy: int = 0) -> pb.GenerateJSONResponse:
        sampling = pb.SamplingParams(temperature=0.0, max_tokens=48)
        request = pb.GenerateJSONRequest(prompt="A person:", json_schema=SCHEMA, sampling=sampling)
        request.cache_policy = policy  # type: ignore[assignment]
        return stub.GenerateJSON(request, timeout=600)

    with pytest.raises(grpc.RpcError) as err:
        ask(pb.CACHE_POLICY_ONLY_IF_CACHED)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    first, second = ask(), ask()
    assert not first.cache_hit and second.cache_hit and second.json == first.json
    assert second.usage.cached_tokens == second.usage.prompt_tokens + second.usage.completion_tokens


def test_metrics_count_hits_misses_and_bytes(stub: pb_grpc.InferenceServiceStub) -> None:
    before = stub.GetMetrics(pb.GetMetricsRequest()).response_cache
    _one(stub, _cached("m1", "Metrics prompt"))
    _one(stub, _cached("m2", "Metrics prompt"))
    after = stub.GetMetrics(pb.GetMetricsRequest()).response_cache
    assert (after.hits - before.hits, after.misses - before.misses, after.stores - before.stores) == (1, 1, 1)
    assert after.entries == before.entries + 1 and after.bytes > before.bytes
    assert after.capacity_bytes == 1 << 20


def test_answers_survive_a_restart_with_a_cache_file(tmp_path: Path) -> None:
    db = str(tmp_path / "restart.db")
    first_server = start_server(response_cache_bytes=1 << 20, response_cache_db=db)
    try:
        with grpc.insecure_channel(first_server.target) as ch:
            first = _one(pb_grpc.InferenceServiceStub(ch), _cached("p", "Persist me"))
    finally:
        first_server.close()
    second_server = start_server(response_cache_bytes=1 << 20, response_cache_db=db)
    try:
        with grpc.insecure_channel(second_server.target) as ch:
            replay = _one(
                pb_grpc.InferenceServiceStub(ch), _cached("q", "Persist me", pb.CACHE_POLICY_ONLY_IF_CACHED)
            )
    finally:
        second_server.close()
    assert replay.done is not None and replay.done.cache_hit and replay.text == first.text


def test_cache_hit_is_on_the_request_span_and_in_the_otel_metrics() -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry = OTelTelemetry(tracer_provider, MeterProvider(metric_readers=[reader]))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = InferenceServer(server_config(response_cache_bytes=1 << 20), telemetry)

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(120)

    try:
        port = call(server.start())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.InferenceServiceStub(ch)
            for rid in ("o1", "o2"):
                _one(stub, _cached(rid, "Traced prompt"))
            cache = stub.GetMetrics(pb.GetMetricsRequest()).response_cache

            def points() -> dict[Any, Any]:
                data = reader.get_metrics_data()
                assert data is not None
                return {
                    (p.attributes or {}).get("inference.response_cache.outcome"): getattr(p, "value", None)
                    for rm in data.resource_metrics
                    for sm in rm.scope_metrics
                    for metric in sm.metrics
                    if metric.name == "inference.response_cache.requests"
                    for p in metric.data.data_points
                }

            # the OTel view reads a snapshot cached for otel_metrics.SNAPSHOT_TTL_S: wait for a fresh one
            assert wait_for(lambda: points().get("miss") == cache.misses, timeout=600), points()
            seen = points()
    finally:
        call(server.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    attrs: dict[Any, Any] = {
        (s.attributes or {}).get("inference.request_id"): s.attributes for s in spans.get_finished_spans()
    }
    assert (attrs["o1"]["cache.hit"], attrs["o2"]["cache.hit"]) == (False, True)
    assert (seen["exact_hit"], seen["miss"]) == (cache.hits, cache.misses) == (1, 1)


def test_a_tenant_never_gets_another_tenants_cached_answer(tmp_path: Path) -> None:
    tokens = {"alice": "tok-alice-1", "bob": "tok-bob-2"}
    tenants = {name: {"token_sha256": [hashlib.sha256(t.encode()).hexdigest()]} for name, t in tokens.items()}
    (tmp_path / "tenants.json").write_text(json.dumps({"tenants": tenants}))
    srv = start_server(response_cache_bytes=1 << 20, auth_tokens=str(tmp_path / "tenants.json"))
    try:
        with grpc.insecure_channel(srv.target) as ch:

            def ask(tenant: str, rid: str, policy: int = 0) -> Result:
                auth = (("authorization", f"Bearer {tokens[tenant]}"),)
                return collect(
                    pb_grpc.InferenceServiceStub(ch).Generate(
                        iter([_cached(rid, "Shared prompt", policy)]), metadata=auth, timeout=600
                    )
                )[rid]

            first = ask("alice", "a1")
            other = ask("bob", "b1", pb.CACHE_POLICY_ONLY_IF_CACHED)
            again = ask("alice", "a2", pb.CACHE_POLICY_ONLY_IF_CACHED)
    finally:
        srv.close()
    assert first.done is not None and not first.done.cache_hit
    assert other.error is not None and other.error.status == "NOT_FOUND"
    assert again.done is not None and again.done.cache_hit and again.text == first.text


def test_a_waiter_runs_itself_when_the_request_it_waits_for_is_cancelled(
    cached_server: RunningServer, stub: pb_grpc.InferenceServiceStub
) -> None:
    before = stub.GetMetrics(pb.GetMetricsRequest()).response_cache
    with grpc.insecure_channel(cached_server.target) as ch, EngineHold(cached_server.engine) as hold:
        leader, waiter = OpenStream(ch), OpenStream(ch)
        leader.send(_cached("lead", "Count slowly from one to a hundred:", max_tokens=64, ignore_eos=True))
        assert leader.next_event().WhichOneof("event") == "delta"  # running, held after its first step
        waiter.send(_cached("wait", "Count slowly from one to a hundred:", max_tokens=64, ignore_eos=True))
        assert wait_for(
            lambda: stub.GetMetrics(pb.GetMetricsRequest()).response_cache.coalesced > before.coalesced
        ), "the identical request never started waiting"
        leader.send(pb.GenerateRequest(request_id="lead", cancel=True))
        hold.release()
        leader.close()
        waiter.close()
        events: list[pb.GenerateResponse] = []
        while not events or events[-1].WhichOneof("event") == "delta":
            events.append(waiter.next_event())
        lead_final: pb.GenerateResponse | None = None
        while lead_final is None or lead_final.WhichOneof("event") == "delta":
            lead_final = leader.next_event()
    assert lead_final.done.finish_reason == pb.FINISH_REASON_CANCELLED
    done = events[-1].done
    assert done.finish_reason == pb.FINISH_REASON_LENGTH and not done.cache_hit  # it computed its own answer
    assert sum(len(e.delta.token_ids) for e in events[:-1]) == 64
    after = stub.GetMetrics(pb.GetMetricsRequest()).response_cache
    assert (after.stores - before.stores, after.misses - before.misses) == (1, 2)
