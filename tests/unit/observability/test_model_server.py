"""The vLLM-named series of the model server protocol, computed from the engine's own state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.observability.engine_metrics import EngineMetrics
from service.observability.model_server import ModelServerCollector
from service.request.sequence import FinishReason, Priority, SamplingParams, Sequence
from tests.support.metric_views import FakeEngine, kv_snapshot, scheduler_load


def scrape(engine: FakeEngine) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(ModelServerCollector(engine, "tiny"))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}"] = s.value
            assert s.labels["model_name"] == "tiny"
    return out


def finished(arrival: float, first_token: float, end: float) -> Sequence:
    seq = Sequence(request_id="r", token_ids=[1, 2, 3], params=SamplingParams(), priority=Priority.INTERACTIVE)
    seq.arrival, seq.first_scheduled, seq.first_token_time, seq.finish_time = arrival, arrival, first_token, end
    seq.finish_reason = FinishReason.STOP
    return seq


def test_gauges_follow_the_scheduler_and_the_kv_pool() -> None:
    engine = FakeEngine(scheduler_load(running=2, waiting=3), kv_snapshot(blocks_used=16, blocks_total=64))
    m = scrape(engine)
    assert m["vllm:num_requests_running{}"] == 2 and m["vllm:num_requests_waiting{}"] == 3
    assert m["vllm:kv_cache_usage_perc{}"] == 0.25
    assert m["vllm:cache_config_info{block_size=16,cache_dtype=f16,num_gpu_blocks=64}"] == 1.0


def test_latency_histograms_count_finished_requests_in_seconds() -> None:
    metrics = EngineMetrics()
    engine = FakeEngine(metrics=metrics)
    metrics.on_finish(finished(10.0, 10.03, 10.9))  # TTFT 30 ms, e2e 0.9 s
    metrics.on_finish(finished(20.0, 21.0, 23.0))  # TTFT 1 s, e2e 3 s
    m = scrape(engine)
    assert m["vllm:time_to_first_token_seconds_count{}"] == 2
    assert m["vllm:time_to_first_token_seconds_bucket{le=0.04}"] == 1
    assert m["vllm:time_to_first_token_seconds_bucket{le=1.0}"] == 2
    assert m["vllm:e2e_request_latency_seconds_bucket{le=1.0}"] == 1
    assert m["vllm:e2e_request_latency_seconds_bucket{le=+Inf}"] == 2
    assert abs(m["vllm:e2e_request_latency_seconds_sum{}"] - 3.9) < 1e-9
    assert m["vllm:request_success_total{finished_reason=stop}"] == 2


def test_histograms_and_document_counters_record_the_same_finished_requests() -> None:
    """Issue 27's histograms beside issue 30's document counters: a JSON document closed within its
    budget is a completed request (e2e observed, vLLM's ``stop``) and a ``closed`` document; one cut off
    by max_tokens is ``length`` and ``cut_off``."""

    class Json:
        kind = "json_schema"

    metrics = EngineMetrics()
    engine = FakeEngine(metrics=metrics)
    closed, cut = finished(1.0, 1.1, 1.5), finished(2.0, 2.1, 2.5)
    closed.finish_reason, cut.finish_reason = FinishReason.CLOSED, FinishReason.LENGTH
    closed.grammar = cut.grammar = Json()
    metrics.on_finish(closed)
    metrics.on_finish(cut)
    metrics.on_finish(finished(3.0, 3.1, 3.5))  # plain text, STOP: no document
    m = scrape(engine)
    assert m["vllm:e2e_request_latency_seconds_count{}"] == 3
    assert m["vllm:request_success_total{finished_reason=stop}"] == 2
    assert m["vllm:request_success_total{finished_reason=length}"] == 1
    grammar = metrics.figures().grammar
    assert (grammar.documents_natural, grammar.documents_closed, grammar.documents_cut_off) == (0, 1, 1)
    snap = metrics.snapshot()  # the same figures as plain dicts, as tests and tools index them
    assert snap["grammar"]["documents_closed"] == 1
    assert snap["tiers"][Priority.INTERACTIVE]["completed"] == 3 and snap["tiers"][0]["e2e"]["count"] == 3
