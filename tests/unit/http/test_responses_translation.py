"""OpenAI Responses bodies (stateless) -> the shared chat request: input items, instructions, function tools,
text.format, sampling; the stateless refusals and every bad parameter a 400 naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.http.errors import ApiError
from service.http.requests import parse_chat
from service.http.responses import ResponsesParsed, parse_responses

ADD = {"type": "function", "name": "add", "description": "add two integers", "strict": True,
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"], "additionalProperties": False}}


def parse(**kw: Any) -> ResponsesParsed:
    return parse_responses({"model": "m", "input": "What is 3 plus 4?", **kw}, "m", None)


def refused(**kw: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(**kw)
    assert info.value.status == 400
    return info.value


def test_string_input_and_instructions_are_a_system_and_a_user_turn() -> None:
    p = parse(instructions="Be brief.", temperature=0, max_output_tokens=9, top_p=0.5)
    assert [(m.role, m.content) for m in p.request.messages] == [("system", "Be brief."),
                                                                  ("user", "What is 3 plus 4?")]
    sp = p.request.sampling
    assert (sp.temperature, sp.max_tokens, sp.top_p) == (0.0, 9, 0.5) and not p.output.stream


def test_sdk_defaults_are_served_store_unset_or_false() -> None:
    for store in ({}, {"store": False}):
        p = parse(include=[], stream=True, **store)
        assert p.output.stream and p.echo["tools"] == [] and p.echo["tool_choice"] == "auto"


def test_a_function_call_round_trip_renders_as_the_chat_route_renders_it() -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "What is 3 plus 4?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}]},
             {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add",
              "arguments": '{"a": 3, "b": 4}', "status": "completed"},
             {"type": "function_call_output", "call_id": "call_1", "output": "7"}]
    ours = parse(input=items).request.messages
    chat = parse_chat({"model": "m", "messages": [
        {"role": "user", "content": "What is 3 plus 4?"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "7"}]}, "m", None).request.messages
    assert list(ours) == list(chat)


@pytest.mark.parametrize(("choice", "mode"), [
    (None, "auto"), ("auto", "auto"), ("required", "required"), ({"type": "function", "name": "add"}, "named")])
def test_function_tools_and_tool_choice_map_onto_the_shared_tool_plan(choice: Any, mode: str) -> None:
    p = parse(tools=[ADD], **({"tool_choice": choice} if choice else {}), parallel_tool_calls=False)
    assert p.output.tools is not None and (p.output.tools.mode, p.output.tools.parallel) == (mode, False)
    assert [t.name for t in p.request.tools] == ["add"] and [m.role for m in p.request.messages] == ["user"]
    assert p.echo["parallel_tool_calls"] is False and p.echo["tools"] == [ADD]


def test_text_format_json_schema_is_constrained_and_validated() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    p = parse(text={"format": {"type": "json_schema", "name": "c", "schema": schema, "strict": True}})
    assert json.loads(p.request.response_format.json_schema) == schema and p.output.schema is not None
    assert parse(text={"format": {"type": "json_object"}}).output.schema == '{"type": "object"}'
    assert not parse(text={"format": {"type": "text"}}).request.HasField("response_format")


def test_reasoning_effort_is_the_template_variable_and_metadata_are_echoed() -> None:
    p = parse(reasoning={"effort": "high"}, metadata={"k": "v"}, user="u1", truncation="auto",
              include=["reasoning.encrypted_content"])
    assert p.echo["reasoning"]["effort"] == "high" and p.echo["metadata"] == {"k": "v"} and p.echo["user"] == "u1"
    assert json.loads(p.request.chat_template_kwargs) == {"reasoning_effort": "high"}
    assert refused(reasoning={"effort": "huge"}).param == "reasoning.effort"


def test_a_reasoning_items_text_is_the_thought_of_the_assistant_turn_it_joins() -> None:
    p = parse(input=[{"role": "user", "content": "Hi"},
                     {"type": "reasoning", "id": "rs_1", "summary": [],
                      "content": [{"type": "reasoning_text", "text": "think"}]},
                     {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Yo"}]},
                     {"role": "user", "content": "Again"}])
    assert [(m.role, m.content, m.reasoning_content) for m in p.request.messages] == \
        [("user", "Hi", ""), ("assistant", "Yo", "think"), ("user", "Again", "")]


@pytest.mark.parametrize(("kw", "param"), [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "add"}]}, "input[0]"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type"),
    ({"tools": [{**ADD, "name": "a b"}]}, "tools[0].name"),
    ({"tools": [{**ADD, "parameters": {"type": 5}}]}, "tools[0].parameters"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": [ADD], "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema"}}}, "text.format.name"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"tools": [ADD], "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"truncation": "sometimes"}, "truncation"),
    ({"service_tier": "gold"}, "service_tier"),
    ({"bogus": 1}, "bogus"),
    ({"model": None}, "model"),
])
def test_bad_and_stateful_parameters_are_400_naming_them(kw: dict[str, Any], param: str) -> None:
    assert refused(**kw).param == param
