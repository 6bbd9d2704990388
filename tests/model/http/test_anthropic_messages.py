"""The official Anthropic SDK against ``/v1/messages`` of a real server: messages sync and async, its stream
helper (text, tool use), count_tokens, each error class in Anthropic's shape (also ``x-api-key`` auth and an
error event mid-stream); raw HTTP: the event framing and order, malformed bodies, a client that leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from tests.model.http.conftest import MODEL
from tests.support.http_streams import leave_mid_stream_and_see_it_cancelled, tenants_json
from tests.support.server import RunningServer, assert_kv_clean, free_port, start_server

pytestmark = pytest.mark.model
HI = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}
TOKEN = "tok-anthropic-http"


def root(srv: RunningServer) -> str:
    return f"http://127.0.0.1:{srv.server.http_port}"


@pytest.fixture()
def claude(api_server: RunningServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=root(api_server), api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture()
async def aclaude(api_server: RunningServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=root(api_server), api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture()
def http(api_server: RunningServer) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=root(api_server), timeout=120) as c:
        yield c


def sse(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each event of a raw ``text/event-stream`` body; every event is exactly an
    ``event:`` line and a ``data:`` line, then a blank line."""
    assert raw.endswith("\n\n")
    out = []
    for block in raw.removesuffix("\n\n").split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def sse_lines(lines: Iterator[str]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of the events of a stream read line by line."""
    out, name = [], ""
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            out.append((name, json.loads(line.removeprefix("data: "))))
    return out


def test_message_create_answers_text_with_its_usage(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(model=MODEL, max_tokens=12, messages=HI, extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert 1 <= m.usage.output_tokens <= 12 and m.usage.cache_creation_input_tokens == 0
    counted = claude.messages.count_tokens(model=MODEL, messages=HI).input_tokens
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == counted


async def test_async_client_creates_and_streams_concurrently(aclaude: anthropic.AsyncAnthropic) -> None:
    async def create(i: int) -> str:
        m = await aclaude.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY,
                                          messages=[{"role": "user", "content": f"Count to {i}."}])
        return "".join(b.text for b in m.content if b.type == "text")

    async def streamed() -> str:
        async with aclaude.messages.stream(model=MODEL, max_tokens=8, messages=HI, extra_body=GREEDY) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        assert final.content[0].type == "text" and final.content[0].text == text
        return text

    texts = await asyncio.gather(*(create(i) for i in range(3)), streamed())
    assert all(texts)


def test_stream_helper_accumulates_what_the_events_say(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=16, messages=HI, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text and text
    assert final.stop_reason in ("end_turn", "max_tokens") and 1 <= final.usage.output_tokens <= 16
    counted = claude.messages.count_tokens(model=MODEL, messages=HI).input_tokens
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == counted


def test_stream_helper_tool_use_is_one_valid_block(claude: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    with claude.messages.stream(model=MODEL, max_tokens=48, messages=ask, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    call = final.content[0]
    assert call.name == "get_weather" and set(call.input) == {"city", "unit"} and call.input["unit"] in ("C", "F")
    assert call.id.startswith("toolu_") and kinds.count("input_json") == 1


def test_tool_result_round_trip_answers_text(claude: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    first = claude.messages.create(model=MODEL, max_tokens=64, messages=ask, tools=[WEATHER],
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=GREEDY)
    call = first.content[0]
    assert first.stop_reason == "tool_use" and call.type == "tool_use"
    history = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "12 C, sunny"}]}]
    second = claude.messages.create(model=MODEL, max_tokens=24, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"}, extra_body=GREEDY)
    assert second.stop_reason in ("end_turn", "max_tokens") and [b.type for b in second.content] == ["text"]
    longer = claude.messages.count_tokens(model=MODEL, messages=history).input_tokens
    assert longer > claude.messages.count_tokens(model=MODEL, messages=ask).input_tokens


def test_count_tokens_includes_system_and_tools(claude: anthropic.Anthropic) -> None:
    short = claude.messages.count_tokens(model=MODEL, messages=HI, system="Be brief.").input_tokens
    long = claude.messages.count_tokens(model=MODEL, messages=HI, system="Be brief. " * 8).input_tokens
    tools = claude.messages.count_tokens(model=MODEL, messages=HI, system="Be brief.", tools=[WEATHER]).input_tokens
    assert short < long and short < tools


def test_stop_sequence_ends_the_message_and_is_reported(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(model=MODEL, max_tokens=40, stop_sequences=["\u2603", " "], extra_body=GREEDY,
                               messages=[{"role": "user", "content": "Write one sentence about the sea."}])
    text = "".join(b.text for b in m.content if b.type == "text")
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", " ") and " " not in text


def test_thinking_config_and_history_are_accepted_without_a_thinking_block(claude: anthropic.Anthropic) -> None:
    history = [*HI, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                      {"type": "text", "text": "Hello!"}]},
               {"role": "user", "content": "Again."}]
    m = claude.messages.create(model=MODEL, max_tokens=8, messages=history, thinking={"type": "adaptive"},
                               extra_body=GREEDY)
    assert m.content and all(b.type == "text" for b in m.content)


@pytest.mark.parametrize(("kw", "where"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "messages[0].content[0]: image"),
    ({"temperature": 1.5}, "temperature"),
])
def test_bad_requests_are_bad_request_errors(claude: anthropic.Anthropic, kw: dict[str, Any], where: str) -> None:
    args: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "messages": HI}
    extra = {"temperature": kw.pop("temperature")} if "temperature" in kw else None
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(**{**args, **kw}, extra_body=extra)
    assert info.value.status_code == 400 and where in info.value.message
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_not_found(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.messages.create(model="claude-opus-9", max_tokens=4, messages=HI)
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="claude-opus-9", messages=HI)


def test_prompt_over_the_context_is_refused_before_the_stream_starts(http: httpx2.Client,
                                                                     api_server: RunningServer) -> None:
    body = {"model": MODEL, "max_tokens": 4000, "stream": True, "messages": [{"role": "user", "content": "word " * 500}]}
    r = http.post("/v1/messages", json=body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "context limit" in r.json()["error"]["message"]
    assert_kv_clean(api_server)


def test_stream_framing_is_anthropics_event_sequence(http: httpx2.Client) -> None:
    body = {"model": MODEL, "max_tokens": 6, "stream": True, "ignore_eos": True, "temperature": 0, "messages": HI}
    with http.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r.read().decode())
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events if name != "ping"]
    assert names == ["message_start", "content_block_start", *["content_block_delta"] * (len(names) - 5),
                     "content_block_stop", "message_delta", "message_stop"]
    deltas = [d["delta"]["text"] for n, d in events if n == "content_block_delta"]
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 6 and "".join(deltas)
    assert {d["index"] for n, d in events if n.startswith("content_block")} == {0}


def test_stream_framing_of_a_tool_use_block(http: httpx2.Client) -> None:
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "temperature": 0, "tools": [WEATHER],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    with http.stream("POST", "/v1/messages", json=body) as r:
        events = sse(r.read().decode())
    names = [n for n, _ in events]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert events[1][1]["content_block"]["input"] == {} and events[2][1]["delta"]["type"] == "input_json_delta"
    assert set(json.loads(events[2][1]["delta"]["partial_json"])) == {"city", "unit"}
    assert events[4][1]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(("content", "needle"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b"\xff\xfe\x00", "not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, "not valid JSON"),
    (b'{"model": "%s", "max_tokens": 4}' % MODEL.encode(), "messages"),
    (b'{"model": "%s", "max_tokens": "4", "messages": [{"role": "user", "content": "x"}]}' % MODEL.encode(),
     "max_tokens"),
    (b'{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": 5}]}' % MODEL.encode(), "content"),
    (b'{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "document"}]}]}'
     % MODEL.encode(), "document"),
    (b'{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "x"}]}'
     % MODEL.encode(), "input_schema"),
    (b'{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "top_k": -1}'
     % MODEL.encode(), "top_k"),
    (b'{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "system": 7}'
     % MODEL.encode(), "system"),
])
def test_malformed_bodies_are_4xx_anthropic_errors(http: httpx2.Client, content: bytes, needle: str) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = http.post(path, content=content, headers={"content-type": "application/json"})
        body = r.json()
        assert r.status_code == 400, (path, body)
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        if path == "/v1/messages" or content[:1] != b"{":  # count_tokens: max_tokens is not its field
            assert needle in body["error"]["message"], body


def test_huge_body_and_wrong_method_are_anthropic_errors(http: httpx2.Client, api_server: RunningServer) -> None:
    limit = api_server.server.http.config.max_body_bytes
    r = http.post("/v1/messages", content=b'{"model": "x", "system": "' + b"a" * (limit + 1) + b'"}')
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = http.get("/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_client_leaving_mid_stream_cancels_its_request(api_server: RunningServer) -> None:
    body = {"model": MODEL, "max_tokens": 2000, "stream": True, "ignore_eos": True,
         "messages": [{"role": "user", "content": "Tell a long story."}]}
    leave_mid_stream_and_see_it_cancelled(api_server, "/v1/messages", body, b"content_block_delta")


# -- a server with tenants: x-api-key, 401, and an error event mid-stream ------------------------------------
@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    path = tmp_path_factory.mktemp("anthropic-auth") / "tenants.json"
    path.write_text(tenants_json(TOKEN))
    srv = start_server(http_port=free_port(), auth_tokens=str(path))
    yield srv, path
    srv.close()


def test_x_api_key_authenticates_and_a_bad_one_is_401(secured: tuple[RunningServer, Path]) -> None:
    srv, _ = secured
    with anthropic.Anthropic(base_url=root(srv), api_key=None, default_headers={"x-api-key": TOKEN}, max_retries=0,
                             timeout=120) as good:
        assert good.messages.create(model=MODEL, max_tokens=2, messages=HI).usage.output_tokens == 2
    r = httpx2.post(root(srv) + "/v1/messages", headers={"x-api-key": "not-a-token"},
                    json={"model": MODEL, "max_tokens": 2, "messages": HI})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with anthropic.Anthropic(base_url=root(srv), api_key="not-a-token", max_retries=0) as bad, \
            pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.count_tokens(model=MODEL, messages=HI)
    assert info.value.body["error"]["type"] == "authentication_error"


def test_revoked_key_ends_a_running_stream_with_one_error_event(secured: tuple[RunningServer, Path]) -> None:
    srv, path = secured
    body = {"model": MODEL, "max_tokens": 3000, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell a long story."}]}
    try:
        with httpx2.stream("POST", root(srv) + "/v1/messages", json=body, headers={"x-api-key": TOKEN},
                           timeout=120) as r:
            lines = r.iter_lines()
            assert r.status_code == 200 and next(lines) == "event: message_start"
            path.write_text(tenants_json())  # the key is revoked while its request runs
            srv.server.tenancy.reload()
            events = sse_lines(lines)
    finally:
        path.write_text(tenants_json(TOKEN))
        srv.server.tenancy.reload()
    names = ["message_start", *(n for n, _ in events)]
    assert names[-1] == "error" and names.count("error") == 1 and "message_stop" not in names
    assert events[-1][1]["error"]["type"] == "authentication_error"
    assert_kv_clean(srv)
