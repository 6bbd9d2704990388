"""GET /metrics under load: the model-server-protocol gauges track the queue, the batch and the KV pool."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.observability.setup import make_telemetry
from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer, free_port, server_config, wait_idle

pytestmark = pytest.mark.model
MAX_RUNNING = 2
GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


@pytest.fixture(scope="module")
def small() -> Iterator[RunningServer]:
    config = server_config(http_port=free_port(), max_running=MAX_RUNNING, kv_lanes=8)
    srv = RunningServer(config, make_telemetry(config))  # the OTel metrics too, as `python -m service` has them
    yield srv
    srv.close()


def scrape(http: httpx2.Client) -> dict[str, float]:
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name in GAUGES:
                assert s.labels["model_name"] == MODEL
                out[s.name] = s.value
            elif s.name == "inference_requests_waiting":  # today's metrics, on the same endpoint
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_metrics_show_the_queue_under_load_and_return_to_idle(small: RunningServer) -> None:
    http = httpx2.Client(base_url=f"http://127.0.0.1:{small.server.http_port}", timeout=600)
    idle = scrape(http)
    assert idle["vllm:num_requests_waiting"] == 0 and idle["vllm:num_requests_running"] == 0
    body = {"model": MODEL, "prompt": "List many animals:", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(http.post("/v1/completions", json=body).status_code))
               for _ in range(4 * MAX_RUNNING)]
    for t in threads:
        t.start()
    seen: list[dict[str, float]] = []
    while not any(m["vllm:num_requests_waiting"] > 0 for m in seen) and any(t.is_alive() for t in threads):
        seen.append(scrape(http))
    for t in threads:
        t.join(120)
    assert codes == [200] * len(threads)
    queued = [m for m in seen if m["vllm:num_requests_waiting"] > 0]
    assert queued, "no scrape saw a queued request"
    assert all(m["vllm:num_requests_running"] <= MAX_RUNNING for m in seen)
    assert all(0.0 <= m["vllm:kv_cache_usage_perc"] <= 1.0 for m in seen)
    assert any(m["vllm:kv_cache_usage_perc"] > 0 for m in seen)
    assert all("inference_requests_waiting" in m for m in seen)
    wait_idle(small)
    after = scrape(http)
    assert {k: after[k] for k in GAUGES} == {k: idle[k] for k in GAUGES}


def test_one_scrape_has_the_latency_histograms_beside_the_document_counters(small: RunningServer) -> None:
    """Issue 27's vllm:* histograms and issue 30's JSON document counters on the same /metrics, both
    counting an HTTP request with a JSON Schema."""
    http = httpx2.Client(base_url=f"http://127.0.0.1:{small.server.http_port}", timeout=600)

    def figures() -> dict[str, float]:
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(http.get("/metrics").text):
            for s in family.samples:
                if s.name == "vllm:e2e_request_latency_seconds_count":
                    out["e2e"] = s.value
                elif s.name.startswith("inference_grammar_documents") and s.labels.get("inference_document_end"):
                    out[s.labels["inference_document_end"]] = s.value
        return out

    before = figures()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": "OK?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}}}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
    deadline = time.monotonic() + 30  # NOTE: the OTel view is collected on its own schedule
    while (after := figures()).get("natural", 0) <= before.get("natural", 0):
        assert time.monotonic() < deadline, after
        time.sleep(0.2)
    assert after["e2e"] == before.get("e2e", 0) + 1
