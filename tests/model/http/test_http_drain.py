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
    http = httpx2.Client(base_url=f"http://127.0.0.1:{srv.server.http_port}", timeout=60)
    try:
        body = {"model": MODEL, "prompt": "Count:", "max_tokens": 40, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(x for x in lines if x.startswith("data: "))
            drained = asyncio.run_coroutine_threadsafe(srv.server.drain(30.0), srv.loop)
            deadline = time.monotonic() + 10
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
