"""SIGTERM's drain covers the HTTP API: new requests get 503 with Retry-After, in-flight ones finish."""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import pytest

from tests.model.http.conftest import MODEL
from tests.support.server import free_port, start_server

pytestmark = pytest.mark.model


def test_drain_refuses_new_http_requests_and_lets_streams_finish() -> None:
    srv = start_server(http_port=free_port())
    http = httpx2.Client(base_url=f"http://127.0.0.1:{srv.server.http_port}", timeout=600)
    try:
        body = {"model": MODEL, "prompt": "Count:", "max_tokens": 40, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(x for x in lines if x.startswith("data: "))
            # NOTE: a grace far longer than the stream needs on a busy machine; the drain ends with it
            drained = asyncio.run_coroutine_threadsafe(srv.server.drain(300.0), srv.loop)
            deadline = time.monotonic() + 60
            while http.get("/health").status_code == 200:
                assert time.monotonic() < deadline
            refused = http.post("/v1/chat/completions",
                                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["type"] == "service_unavailable_error"
            rest = [x for x in lines if x.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
        drained.result(60)
    finally:
        srv.close()


def test_drain_rule_over_http_refuses_work_and_answers_reads() -> None:
    """The drain rule of the intake, by route: new work is 503 with the reason (error code and the
    inference-unavailable-reason header, as gRPC's trailing metadata); reads of the model, the metrics
    and the caller's stored files and batches are answered."""
    srv = start_server(http_port=free_port())
    http = httpx2.Client(base_url=f"http://127.0.0.1:{srv.server.http_port}", timeout=600)
    try:
        line = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
                "body": {"model": MODEL, "prompt": "Hi", "max_tokens": 2}}
        files = {"file": ("in.jsonl", json.dumps(line).encode())}
        upload = http.post("/v1/files", files=files, data={"purpose": "batch"}).json()
        batch = http.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/completions",
                                                "completion_window": "24h"}).json()
        asyncio.run_coroutine_threadsafe(srv.server.drain(30.0), srv.loop).result(60)

        work = [http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
                http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
                http.post("/v1/files", files=files, data={"purpose": "batch"}),
                http.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/completions",
                                               "completion_window": "24h"}),
                http.get("/health")]
        for r in work:
            assert r.status_code == 503, (r.request.url, r.text)
            assert r.headers["inference-unavailable-reason"] == "draining" and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "draining" and "another replica" in r.json()["error"]["message"]
        reads = [http.get("/v1/models"), http.get(f"/v1/models/{MODEL}"), http.get("/metrics"),
                 http.get(f"/v1/files/{upload['id']}"), http.get(f"/v1/files/{upload['id']}/content"),
                 http.get(f"/v1/batches/{batch['id']}")]
        assert [r.status_code for r in reads] == [200] * len(reads), [r.text for r in reads]
        assert http.get("/v1/batches/batch_nope").status_code == 404  # answered: not found, not 503
        assert http.post(f"/v1/batches/{batch['id']}/cancel").status_code == 200
    finally:
        srv.close()
