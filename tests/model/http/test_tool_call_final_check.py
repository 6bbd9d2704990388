"""A tool call whose arguments break a keyword the grammar cannot enforce (here ``uniqueItems``: every array
the grammar allows repeats its one item) is a 400 ``schema_not_enforced`` in every dialect's own error
shape, unstreamed and streamed (the stream's last event is the dialect's error event, its only terminal
one), and the ``openai`` SDK raises ``BadRequestError`` for it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer

pytestmark = pytest.mark.model
REPEATS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a"]}, "minItems": 2,
                                                     "maxItems": 2, "uniqueItems": True}},
           "required": ["tags"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Tag this."}]
CHAT = {"model": MODEL, "messages": ASK, "max_tokens": 64, "temperature": 0, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "tag", "parameters": REPEATS}}]}
MESSAGES = {"model": MODEL, "messages": ASK, "max_tokens": 64, "temperature": 0, "tool_choice": {"type": "any"},
            "tools": [{"name": "tag", "input_schema": REPEATS}]}
RESPONSES = {"model": MODEL, "input": "Tag this.", "max_output_tokens": 64, "temperature": 0,
             "tool_choice": "required", "tools": [{"type": "function", "name": "tag", "parameters": REPEATS}]}
BROKE = "the model's output broke `uniqueItems` at /tags, a keyword this server checks only after generation"


@pytest.fixture()
def http(api_server: RunningServer) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=f"http://127.0.0.1:{api_server.server.http_port}", timeout=600) as c:
        yield c


def sse(http: httpx2.Client, path: str, body: dict[str, Any]) -> list[Any]:
    """Every ``data:`` payload of a streamed answer (200 once the first event is known)."""
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines]


def test_chat_completions_is_a_400_naming_the_keyword_and_the_tools_parameters(http: httpx2.Client) -> None:
    r = http.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "schema_not_enforced",
                                                              "tools[0].function.parameters")
    assert error["message"].startswith(BROKE)


def test_the_openai_sdk_raises_bad_request_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert info.value.status_code == 400 and info.value.code == "schema_not_enforced"
    assert info.value.param == "tools[0].function.parameters"


def test_streamed_chat_completions_ends_with_one_error_event(http: httpx2.Client) -> None:
    events = sse(http, "/v1/chat/completions", CHAT)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "schema_not_enforced"
    assert events[-2]["error"]["message"].startswith(BROKE)
    chunks = [e for e in events[:-2] if isinstance(e, dict)]
    assert not any(c["choices"] and c["choices"][0].get("finish_reason") for c in chunks)  # no other end


def test_anthropic_messages_is_a_400_invalid_request_error(http: httpx2.Client) -> None:
    r = http.post("/v1/messages", json=MESSAGES)
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith(BROKE)
    events = sse(http, "/v1/messages", MESSAGES)
    assert [e["type"] for e in events].count("message_stop") == 0
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "invalid_request_error"


def test_responses_is_a_400_and_a_streamed_response_failed(http: httpx2.Client) -> None:
    r = http.post("/v1/responses", json=RESPONSES)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["code"], error["type"], error["param"]) == ("schema_not_enforced", "invalid_request_error",
                                                              "tools[0].parameters")
    events = sse(http, "/v1/responses", RESPONSES)
    ends = [e["type"] for e in events if e["type"] in ("response.completed", "response.incomplete", "response.failed")]
    assert ends == ["response.failed"] and events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "schema_not_enforced"
