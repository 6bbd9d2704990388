"""Raw HTTP: the SSE framing, and malformed bodies (invalid JSON, wrong types, huge bodies) are 4xx, never 500."""

from __future__ import annotations

import json
import socket

import httpx2
import pytest

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model


@pytest.fixture()
def http(api_server: RunningServer) -> httpx2.Client:
    return httpx2.Client(base_url=f"http://127.0.0.1:{api_server.server.http_port}", timeout=600)


def test_sse_framing_is_data_lines_ending_with_done(http: httpx2.Client) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
    assert "".join(p["choices"][0]["text"] for p in payloads) and payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert len({p["id"] for p in payloads}) == 1 and all(p["object"] == "text_completion" for p in payloads)


@pytest.mark.parametrize(("content", "status", "param"), [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"model": "%s", "messages": [{"role": "user", "content": 5}]}' % MODEL.encode(), 400, "messages[0].content"),
    (b'{"model": "%s", "messages": [{"role": "robot", "content": "x"}]}' % MODEL.encode(), 400, "messages[0].role"),
    (b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}' % MODEL.encode(), 400,
     "max_tokens"),
    (b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "n": 1e400}' % MODEL.encode(), 400, "n"),
    (b"\xff\xfe\x00", 400, None),
    (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
    (b'[' * 100000 + b']' * 100000, 400, None),
])
def test_malformed_bodies_are_4xx_openai_errors(http: httpx2.Client, content: bytes, status: int,
                                                param: str | None) -> None:
    r = http.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_huge_body_is_413_before_it_is_read(http: httpx2.Client, api_server: RunningServer) -> None:
    limit = api_server.server.http.config.max_body_bytes
    big = b'{"model": "x", "prompt": "' + b"a" * (limit + 1) + b'"}'
    r = http.post("/v1/completions", content=big)
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"

    def chunks() -> object:
        for _ in range(limit // 65536 + 2):
            yield b"a" * 65536

    r = http.post("/v1/completions", content=chunks())  # chunked: no content-length to refuse up front
    assert r.status_code == 413


def test_unknown_route_and_wrong_method_are_openai_errors(http: httpx2.Client) -> None:
    assert http.get("/v1/nothing").status_code == 404
    r = http.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


def test_one_bad_request_does_not_disturb_a_streaming_one(http: httpx2.Client, api_server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Count: 1, 2,", "max_tokens": 24, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert http.post("/v1/completions", content=b"{oops").status_code == 400
        rest = [line for line in lines if line.startswith("data: ")]
    texts = [json.loads(x[6:])["choices"][0] for x in [first, *rest[:-1]]]
    assert rest[-1] == "data: [DONE]" and texts[-1]["finish_reason"] == "length"
    assert_kv_clean(api_server)


def test_x_priority_header_runs_the_request_in_the_batch_tier(http: httpx2.Client, api_server: RunningServer) -> None:
    from service.request.sequence import Priority

    tiers = api_server.engine.metrics.tiers
    before = (tiers[Priority.BATCH].requests, tiers[Priority.INTERACTIVE].requests)
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
    assert http.post("/v1/completions", json=body, headers={"x-priority": "batch"}).status_code == 200
    assert http.post("/v1/completions", json={**body, "service_tier": "flex"}).status_code == 200
    assert http.post("/v1/completions", json=body).status_code == 200
    assert (tiers[Priority.BATCH].requests, tiers[Priority.INTERACTIVE].requests) == (before[0] + 2, before[1] + 1)
    r = http.post("/v1/completions", json=body, headers={"x-priority": "urgent"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"


def test_accepted_connections_send_without_nagle_delay(http: httpx2.Client, api_server: RunningServer) -> None:
    """TCP_NODELAY on every accepted socket: without it a stream's first event waited for the client's
    delayed ACK of the status line (40 ms on Linux) before it left the server."""
    assert http.get("/v1/models").status_code == 200  # the keep-alive connection stays open
    front = api_server.server.http
    assert front is not None
    connections = list(front.server.server_state.connections)
    assert connections, "no open HTTP connection on the server"
    for protocol in connections:
        sock = protocol.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
