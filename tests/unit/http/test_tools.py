"""tools / tool_choice / parallel_tool_calls -> the template's tools and the grammar of the model's call syntax;
an answer read as it comes -> its content and validated tool_calls (here in the generic family's syntax)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.chat.calls import ToolCall
from service.chat.families import GENERIC
from service.http.errors import ApiError
from service.http.requests import Parsed, parse_chat, with_format
from service.http.tools import CallReader, ToolPlan
from tests.support.tool_formats import GENERIC_FORMAT

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def plan(choice: Any, tools: list[Any] | None = None, **kw: Any) -> Parsed:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools or [WEATHER, TIME], **kw}
    if choice is not None:
        body["tool_choice"] = choice
    return with_format(parse_chat(body, "m", None), GENERIC_FORMAT)


def read(p: ToolPlan, text: str, step: int = 3) -> CallReader:
    reader = CallReader.of(p)
    for i in range(0, len(text), step):
        reader.feed(text[i:i + step])
    reader.close(complete=True)
    return reader


def calls(*pairs: tuple[str, str]) -> str:
    return GENERIC.syntax.render([ToolCall(name, args) for name, args in pairs])


def test_the_tools_go_to_the_template_and_the_grammar_is_the_familys_syntax() -> None:
    p = plan(None)
    assert [(t.name, json.loads(t.parameters)) for t in p.request.tools] == [
        ("get_weather", WEATHER["function"]["parameters"]), ("get_time", {"type": "object", "properties": {}})]
    assert [m.role for m in p.request.messages] == ["user"]  # no system turn added: the renderer decides
    grammar = p.request.response_format.lark_grammar
    assert grammar.startswith("start: TEXT | head calls") and '"const": "get_weather"' in grammar
    assert p.output.schema is None


def test_a_named_function_allows_only_its_calls() -> None:
    grammar = plan({"type": "function", "function": {"name": "get_weather"}}).request.response_format.lark_grammar
    assert grammar.startswith("start: calls") and "get_weather" in grammar and "get_time" not in grammar


def test_parallel_tool_calls_false_allows_one_call() -> None:
    assert "call)*" in plan("required").request.response_format.lark_grammar
    assert "call)*" not in plan("required", parallel_tool_calls=False).request.response_format.lark_grammar


def test_an_answer_is_its_content_then_its_calls_with_the_arguments_as_written() -> None:
    p = plan(None).output.tools
    assert p is not None
    text = "Let me look.\n" + calls(("get_weather", '{"city": "Rome"}'), ("get_time", "{}"))
    reader = read(p, text)
    assert reader.content == "Let me look.\n"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in reader.calls] == [
        ("get_weather", '{"city": "Rome"}'), ("get_time", "{}")]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in reader.calls)


def test_plain_text_is_content_and_no_call() -> None:
    p = plan(None).output.tools
    assert p is not None
    reader = read(p, "It is sunny.")
    assert (reader.content, reader.calls) == ("It is sunny.", [])


def test_streamed_deltas_start_each_call_with_its_name_then_concatenate_to_the_arguments() -> None:
    p = plan("required").output.tools
    assert p is not None
    reader, deltas = CallReader.of(p), []
    text = calls(("get_weather", '{"city": "Rome"}'), ("get_time", "{}"))
    for ch in text:
        deltas += reader.feed(ch)[1]
    deltas += reader.close(complete=True)[1]
    firsts = [d for d in deltas if "id" in d]
    assert [(d["index"], d["function"]["name"], d["function"]["arguments"]) for d in firsts] == [
        (0, "get_weather", ""), (1, "get_time", "")]
    for i, call in enumerate(reader.calls):
        pieces = "".join(d["function"].get("arguments", "") for d in deltas if d["index"] == i)
        assert pieces == call["function"]["arguments"]


def test_a_call_that_does_not_validate_is_a_400_naming_the_keyword_and_the_tools_parameters() -> None:
    p = plan(None).output.tools
    assert p is not None
    with pytest.raises(ApiError) as info:
        read(p, calls(("get_weather", '{"town": 1}')))
    e = info.value
    assert (e.status, e.type, e.code, e.param) == (400, "invalid_request_error", "schema_not_enforced",
                                                   "tools[0].function.parameters")
    assert str(e).startswith("the model's output broke `required` at /, a keyword this server checks only after")


def test_a_call_of_no_tool_is_off_the_call_syntax_a_500() -> None:
    p = plan("required").output.tools
    assert p is not None
    with pytest.raises(ApiError) as info:
        read(p, calls(("not_a_tool", "{}")))
    assert (info.value.status, info.value.type) == (500, "server_error")


def test_a_call_cut_off_is_neither_an_error_nor_a_call() -> None:
    p = plan("required").output.tools
    assert p is not None
    reader = CallReader.of(p)
    reader.feed(calls(("get_weather", '{"city": "Rome"}'))[:30])
    assert reader.close(complete=False) == ("", [])


def test_tool_choice_none_leaves_tools_out() -> None:
    p = plan("none")
    assert p.output.tools is None and not p.request.HasField("response_format") and not p.request.tools
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


def test_template_variables_reach_the_request() -> None:
    p = plan(None, reasoning_effort="low", chat_template_kwargs={"enable_thinking": False})
    assert json.loads(p.request.chat_template_kwargs) == {"enable_thinking": False, "reasoning_effort": "low"}
    with pytest.raises(ApiError) as info:
        plan(None, reasoning_effort="extreme")
    assert info.value.param == "reasoning_effort"
    with pytest.raises(ApiError) as info:
        plan(None, chat_template_kwargs=["x"])
    assert info.value.param == "chat_template_kwargs"


def test_a_call_off_a_keyword_the_grammar_left_out_is_caught_by_the_final_validation() -> None:
    unique = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "b": {"type": "array", "uniqueItems": True, "items": {"type": "integer"}}}}}}
    p = plan("required", [unique]).output.tools
    assert p is not None and "uniqueItems" not in p.grammar()
    read(p, calls(("f", '{"b": [1, 2]}')))
    with pytest.raises(ApiError) as info:
        read(p, calls(("f", '{"b": [1, 1]}')))
    assert (info.value.status, info.value.code, info.value.param) == (400, "schema_not_enforced",
                                                                      "tools[0].function.parameters")
    assert "broke `uniqueItems` at /b," in str(info.value)
