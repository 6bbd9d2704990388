"""One request's preparation never stalls the others (service/api/preparer.py: off the event loop).

A chat of 20,000 messages used to be rendered and tokenized on the event loop, freezing /health and
every gRPC and HTTP call for 11 s (150,000 messages: minutes). Preparation now runs in worker threads,
and a prompt too long for any tokenization to fit the context is refused before it is tokenized.
(More messages than ``--max-messages``, 10,000 by default, are refused before they are even parsed:
the chats here stay within it; tests/model/hostile/test_size_limits.py.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx2
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer

pytestmark = pytest.mark.model

N_MESSAGES = 10_000  # the default --max-messages


def chat(n: int, content: str = "a short message") -> dict[str, Any]:
    roles = ("user", "assistant")
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": roles[i % 2], "content": content} for i in range(n)]}


def http_base(srv: RunningServer) -> str:
    return f"http://127.0.0.1:{srv.server.http_port}"


@pytest.fixture()
def held_preparation(
    api_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The big chat's real preparation, held at its end (in its worker thread) until ``release``: (inside, release)."""
    preparer = api_server.server.intake.preparer
    real = preparer.plan
    inside, release = threading.Event(), threading.Event()

    def plan(ask: Any) -> Any:
        try:
            return real(ask)
        finally:
            if len(ask.messages) == N_MESSAGES:
                inside.set()
                release.wait(120)

    monkeypatch.setattr(preparer, "plan", plan)
    yield inside, release
    release.set()


def test_health_and_grpc_answer_while_a_10000_message_chat_is_being_prepared(
    api_server: RunningServer, held_preparation: tuple[threading.Event, threading.Event]
) -> None:
    inside, release = held_preparation
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(httpx2.post, f"{http_base(api_server)}/v1/chat/completions", json=chat(N_MESSAGES),
                          timeout=300)
        assert inside.wait(120), "the chat's preparation never started"
        # NOTE: the chat's preparation is still in progress (held): the loop must answer meanwhile.
        health = httpx2.get(f"{http_base(api_server)}/health", timeout=600)
        with grpc.insecure_channel(api_server.target) as ch:
            check = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=600)
        models = httpx2.get(f"{http_base(api_server)}/v1/models", timeout=600)
        assert not big.done()
        release.set()
        refused = big.result()
    assert refused.status_code == 400 and "the context limit is" in refused.json()["error"]["message"]
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL


def test_a_chat_that_cannot_fit_the_context_is_refused_before_it_is_tokenized(api_server: RunningServer) -> None:
    builder = api_server.server.intake.builder
    chars = builder.limits.max_context * builder.max_piece_bytes  # no tokenization of this many fits
    r = httpx2.post(f"{http_base(api_server)}/v1/chat/completions",
                    json=chat(2, "word " * (chars // 10 + 1)), timeout=600)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is at least ")
    assert f"the context limit is {builder.limits.max_context} tokens" in error["message"]
    r = httpx2.post(f"{http_base(api_server)}/v1/completions",
                    json={"model": MODEL, "prompt": "word " * (chars // 5 + 1), "max_tokens": 4}, timeout=600)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt is at least "), r.text


def test_a_rendered_chat_too_long_for_the_context_is_refused_before_it_is_tokenized(
    api_server: RunningServer,
) -> None:
    """Short contents, many turns: the contents fit the first check; the rendered chat does not."""
    builder = api_server.server.intake.builder
    chars = builder.limits.max_context * builder.max_piece_bytes
    content = "forty characters, which is a few words.."
    n = chars // len(content) * 9 // 10  # contents alone: 90% of the bound; each turn's markers add more
    assert n <= builder.limits.inputs.max_messages
    r = httpx2.post(f"{http_base(api_server)}/v1/chat/completions", json=chat(n, content), timeout=300)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("prompt is at least "), r.text
