"""Counts past the server's limits are refused before the work that grows with them, on a real server.

--max-messages, --max-tools, --max-stop-strings and --max-logit-bias: HTTP answers 400 with
OpenAI's error object naming the parameter and the flag, gRPC INVALID_ARGUMENT naming the flag;
a refused chat is neither rendered nor tokenized. The defaults (OpenAI's 128 tools) hold on a
server started without the flags.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx2
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.http.conftest import MODEL, base_url
from tests.support.helpers import req, run_stream
from tests.support.server import RunningServer, free_port, start_server

pytestmark = pytest.mark.model

LIMITS = {"max_messages": 4, "max_tools": 2, "max_stop_strings": 2, "max_logit_bias": 2}
FLAG = {"messages": "--max-messages", "tools": "--max-tools", "stop": "--max-stop-strings",
        "logit_bias": "--max-logit-bias"}


@pytest.fixture(scope="module")
def srv() -> Iterator[RunningServer]:
    s = start_server(http_port=free_port(), **LIMITS)
    yield s
    s.close()


@pytest.fixture()
def stub(srv: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(srv.target) as ch:
        yield pb_grpc.InferenceServiceStub(ch)


def turns(n: int) -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": f"turn {i}"} for i in range(n)]


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def post(srv: RunningServer, path: str, body: dict[str, Any]) -> httpx2.Response:
    return httpx2.post(f"{base_url(srv)}{path}", json={"model": MODEL, "max_tokens": 1, **body}, timeout=60)


class Renders:
    """Counts the server's chat renders and tokenizer calls (a spy on the real ones, for one test)."""

    def __init__(self, srv: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
        builder = srv.server.intake.builder
        self.calls = 0
        for owner, name in ((builder.template, "render"), (builder.vocab, "tokenize")):
            monkeypatch.setattr(owner, name, self._counted(getattr(owner, name)))

    def _counted(self, fn: Any) -> Any:
        def counted(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            return fn(*args, **kw)
        return counted


CASES = [
    ("/chat/completions", {"messages": turns(5)}, "messages", 5),
    ("/chat/completions", {"messages": turns(1), "tools": [tool("a"), tool("b"), tool("c")]}, "tools", 3),
    ("/chat/completions", {"messages": turns(1), "stop": ["a", "b", "c"]}, "stop", 3),
    ("/chat/completions", {"messages": turns(1), "logit_bias": {"1": 1, "2": 1, "3": 1}}, "logit_bias", 3),
    ("/completions", {"prompt": "Hi", "stop": ["a", "b", "c"]}, "stop", 3),
    ("/completions", {"prompt": "Hi", "logit_bias": {"1": 1, "2": 1, "3": 1}}, "logit_bias", 3),
]


@pytest.mark.parametrize(("path", "body", "param", "count"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_http_counts_past_the_flags_are_a_400_naming_the_param_and_the_flag(
    srv: RunningServer, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any], param: str, count: int
) -> None:
    renders = Renders(srv, monkeypatch)
    r = post(srv, path, body)
    assert r.status_code == 400, r.text
    limit = LIMITS[f"max_{param}" if param != "stop" else "max_stop_strings"]
    assert r.json() == {"error": {
        "message": f"{param} has {count} entries; at most {limit} are accepted (server flag {FLAG[param]})",
        "type": "invalid_request_error", "param": param, "code": None}}
    assert renders.calls == 0  # refused before the chat was rendered or anything tokenized


def test_at_the_limits_a_chat_is_answered(srv: RunningServer) -> None:
    r = post(srv, "/chat/completions", {"messages": [*turns(3), {"role": "user", "content": "ok"}],
                                        "tools": [tool("a"), tool("b")], "tool_choice": "none",
                                        "stop": ["a", "b"], "logit_bias": {"1": 1, "2": 1}})
    assert r.status_code == 200, r.text


def test_grpc_generate_with_too_many_messages_is_invalid_argument(
    srv: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    renders = Renders(srv, monkeypatch)
    messages = [pb.ChatMessage(**m) for m in turns(5)]
    with grpc.insecure_channel(srv.target) as ch:
        out = run_stream(ch, [req("many", max_tokens=1, messages=messages)], timeout=60)["many"]
    assert out.error is not None and out.error.status == "INVALID_ARGUMENT"
    assert out.error.message == "messages has 5 entries; at most 4 are accepted (server flag --max-messages)"
    assert renders.calls == 0


@pytest.mark.parametrize("rpc", ["GenerateJSON", "Tokenize", "CountTokens"])
def test_every_rpc_that_takes_messages_refuses_too_many(stub: Any, rpc: str) -> None:
    messages = [pb.ChatMessage(**m) for m in turns(5)]
    request = {
        "GenerateJSON": lambda: pb.GenerateJSONRequest(messages=messages, json_schema='{"type": "object"}'),
        "Tokenize": lambda: pb.TokenizeRequest(messages=messages),
        "CountTokens": lambda: pb.CountTokensRequest(messages=messages),
    }[rpc]()
    with pytest.raises(grpc.RpcError) as err:
        getattr(stub, rpc)(request, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 4 are accepted (server flag --max-messages)" in (err.value.details() or "")


@pytest.mark.parametrize(("field", "value"), [("stop", ["a", "b", "c"]), ("logit_bias", {1: 1.0, 2: 1.0, 3: 1.0})])
def test_grpc_stop_strings_and_logit_bias_past_the_flags_are_invalid_argument(
    srv: RunningServer, field: str, value: Any
) -> None:
    with grpc.insecure_channel(srv.target) as ch:
        out = run_stream(ch, [req("r", "Hi", max_tokens=1, **{field: value})], timeout=60)["r"]
    assert out.error is not None and out.error.status == "INVALID_ARGUMENT"
    assert out.error.message.startswith(f"{field} has 3 entries; at most 2 are accepted (server flag {FLAG[field]})")


def test_the_default_tool_limit_is_openais_128() -> None:
    s = start_server(http_port=free_port())
    try:
        r = post(s, "/chat/completions", {"messages": turns(1), "tools": [tool(f"f{i}") for i in range(129)]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
        assert r.json()["error"]["message"] == "tools has 129 entries; at most 128 are accepted (server flag --max-tools)"
    finally:
        s.close()
