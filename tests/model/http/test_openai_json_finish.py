"""Structured output that finishes by default over HTTP: a ``response_format`` document that would not end
within max_tokens is closed with its shortest valid completion (``finish_reason: "stop"`` and the extension
field ``json_closed: true``); the old cut-off is one option away (the body's ``json_finish: "cut-off"``:
tests/model/http/test_openai_chat.py, or a server started with ``--json-finish cut-off``); a forced tool call is never closed early unless asked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.model.http.conftest import MODEL, base_url
from tests.support.server import RunningServer, assert_kv_clean, free_port, start_server

pytestmark = pytest.mark.model
REVIEW = {
    "type": "object",
    "properties": {
        "product": {"type": "string"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "pros": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "cons": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "summary": {"type": "string"},
    },
    "required": ["product", "rating", "pros", "cons", "summary"],
}
TEAM = {"type": "object", "required": ["team", "members"], "properties": {
    "team": {"type": "string"},
    "members": {"type": "array", "minItems": 2, "items": {
        "type": "object", "required": ["name", "code"],
        "properties": {"name": {"type": "string"}, "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
    }},
}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def fmt(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def closed_count(srv: RunningServer) -> int:
    return int(srv.engine.metrics.snapshot()["grammar"]["documents_closed"])


@pytest.fixture(scope="module")
def cut_off_server() -> Iterator[RunningServer]:
    srv = start_server(http_port=free_port(), json_finish="cut-off")
    yield srv
    srv.close()


def sdk(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url(srv), api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_by_default_a_review_at_128_tokens_is_a_complete_valid_document(
    client: openai.OpenAI, api_server: RunningServer, seed: int
) -> None:
    before = closed_count(api_server)
    r = client.chat.completions.create(model=MODEL, max_tokens=128, seed=seed, response_format=fmt("review", REVIEW),
                                       messages=[{"role": "user", "content": "Write a detailed review of a laptop."}])
    c = r.choices[0]
    assert c.finish_reason == "stop" and r.usage is not None and r.usage.completion_tokens <= 128
    jsonschema.validate(json.loads(c.message.content or ""), REVIEW)
    closed = (c.model_extra or {}).get("json_closed", False)
    assert closed_count(api_server) - before == (1 if closed else 0)  # the field says what the engine did


def test_a_closed_document_says_so_streamed_too(client: openai.OpenAI, api_server: RunningServer) -> None:
    messages = [{"role": "user", "content": "A team of three, as JSON."}]
    with pytest.raises(openai.BadRequestError) as info:  # below the shortest document: refused up front, naming it
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, response_format=fmt("t", TEAM))
    minimum = int(info.value.message.rsplit("at least ", 1)[1].split()[0].strip("'\"}.,"))
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=minimum, temperature=0,
                                       response_format=fmt("t", TEAM))
    c = r.choices[0]
    assert c.finish_reason == "stop" and (c.model_extra or {}).get("json_closed") is True
    jsonschema.validate(json.loads(c.message.content or ""), TEAM)
    chunks = [ch for ch in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=minimum, temperature=0, response_format=fmt("t", TEAM), stream=True)
        if ch.choices]
    last = chunks[-1].choices[0]
    assert last.finish_reason == "stop" and (last.model_extra or {}).get("json_closed") is True
    jsonschema.validate(json.loads("".join(ch.choices[0].delta.content or "" for ch in chunks)), TEAM)
    assert_kv_clean(api_server)


def test_a_cut_off_server_cuts_off_unless_the_request_asks_to_close(cut_off_server: RunningServer) -> None:
    messages = [{"role": "user", "content": "A team of three, as JSON."}]
    with sdk(cut_off_server) as client:
        cut = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                             response_format=fmt("t", TEAM))
        assert cut.choices[0].finish_reason == "length" and "json_closed" not in (cut.choices[0].model_extra or {})
        closed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0,
                                                response_format=fmt("t", TEAM), extra_body={"json_finish": "close"})
    assert closed.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(closed.choices[0].message.content or ""), TEAM)
    assert closed_count(cut_off_server) == (1 if (closed.choices[0].model_extra or {}).get("json_closed") else 0)
    assert_kv_clean(cut_off_server)


def test_a_forced_tool_call_is_cut_off_not_closed_by_default(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, tools=[WEATHER], tool_choice="required", max_tokens=4,
                                       temperature=0, messages=[{"role": "user", "content": "Weather in Oslo?"}])
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None


@pytest.mark.parametrize(("endpoint", "extra", "param"), [
    ("chat", {"json_finish": "sometimes"}, "json_finish"),
    ("chat", {"json_repeat_penalty": 9}, "json_repeat_penalty"),
    ("chat-text", {"json_finish": "close"}, "json_finish"),
    ("completions", {"json_finish": "close"}, "json_finish"),
    ("completions", {"json_repeat_penalty": 0.5}, "json_repeat_penalty"),
])
def test_bad_json_options_are_a_400_naming_them(client: openai.OpenAI, endpoint: str, extra: dict[str, Any],
                                                param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        if endpoint == "completions":
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body=extra)
        else:
            rf = {"response_format": fmt("r", REVIEW)} if endpoint == "chat" else {}
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=64,
                                           extra_body=extra, **rf)  # type: ignore[call-overload]
    assert info.value.body["param"] == param and info.value.body["type"] == "invalid_request_error"


def test_json_options_that_change_nothing_are_accepted(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2,
                                  extra_body={"json_finish": "cut-off", "json_repeat_penalty": 0})
    assert r.choices[0].finish_reason in ("stop", "length")
    r2 = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A review."}],
                                        max_tokens=128, response_format=fmt("r", REVIEW),
                                        extra_body={"json_repeat_penalty": 1.2})
    jsonschema.validate(json.loads(r2.choices[0].message.content or ""), REVIEW)
