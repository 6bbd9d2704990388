"""tools / tool_choice -> prompt text and output grammar; finished output -> validated tool_calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.http.errors import ApiError
from service.http.requests import parse_chat
from service.http.tools import tool_calls

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def plan(choice: Any, tools: list[Any] | None = None) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools or [WEATHER, TIME]}
    if choice is not None:
        body["tool_choice"] = choice
    return parse_chat(body, "m", None)


def test_named_function_generates_its_arguments_under_its_schema() -> None:
    p = plan({"type": "function", "function": {"name": "get_weather"}})
    schema = json.loads(p.request.response_format.json_schema)
    assert schema == WEATHER["function"]["parameters"] and p.output.schema is not None
    assert p.request.messages[0].role == "system" and "get_weather" in p.request.messages[0].content
    calls = tool_calls(p.output.tools, '{"city":"Oslo"}')
    assert calls is not None and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}


def test_required_chooses_among_the_functions_with_an_anyof() -> None:
    p = plan("required")
    schema = json.loads(p.request.response_format.json_schema)
    assert [o["properties"]["name"]["const"] for o in schema["anyOf"]] == ["get_weather", "get_time"]
    calls = tool_calls(p.output.tools, '{"name":"get_time","arguments":{}}')
    assert calls is not None and calls[0]["function"] == {"name": "get_time", "arguments": "{}"}


def test_auto_is_text_or_a_tagged_call_and_a_call_is_validated() -> None:
    p = plan(None)
    assert p.request.response_format.lark_grammar.startswith("start: TEXT |")
    assert p.output.schema is None
    assert tool_calls(p.output.tools, "It is sunny.") is None
    call = tool_calls(p.output.tools, '<tool_call>{"name":"get_weather","arguments":{"city":"Rome"}}</tool_call>')
    assert call is not None and json.loads(call[0]["function"]["arguments"]) == {"city": "Rome"}
    with pytest.raises(ApiError) as info:
        tool_calls(p.output.tools, '<tool_call>{"name":"get_weather","arguments":{"town":1}}</tool_call>')
    assert (info.value.status, info.value.type) == (500, "server_error")


def test_tool_choice_none_leaves_tools_out() -> None:
    p = plan("none")
    assert p.output.tools is None and not p.request.HasField("response_format")
    assert [m.role for m in p.request.messages] == ["user"]


@pytest.mark.parametrize(("tools", "choice", "param"), [
    ([{"type": "custom", "custom": {}}], "auto", "tools[0]"),
    ([{"type": "function", "function": {"name": "a b"}}], "auto", "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "a", "parameters": {"type": 5}}}], "auto", "tools[0].function.parameters"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    ([WEATHER, WEATHER], "auto", "tools"),
])
def test_bad_tools_are_refused_naming_the_parameter(tools: list[Any], choice: Any, param: str) -> None:
    with pytest.raises(ApiError) as info:
        plan(choice, tools)
    assert (info.value.status, info.value.param) == (400, param)


def test_tools_and_response_format_do_not_mix() -> None:
    with pytest.raises(ApiError) as info:
        parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
                    "response_format": {"type": "json_object"}}, "m", None)
    assert info.value.param == "response_format"
