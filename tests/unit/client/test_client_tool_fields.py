"""The client's tools fields: each accepted shape of a tool, a tool choice and an earlier call becomes the
proto the server reads."""

from __future__ import annotations

import json

import pytest
from inference.v1 import inference_pb2 as pb
from inference_client import RequestSpec, ToolCall
from inference_client.model_calls import count_request

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.mark.parametrize("tool", [
    {"type": "function", "function": {"name": "w", "description": "d", "parameters": PARAMS}},
    {"name": "w", "description": "d", "parameters": PARAMS},
    {"name": "w", "description": "d", "parameters": json.dumps(PARAMS)},
    pb.Tool(name="w", description="d", parameters=json.dumps(PARAMS)),
])
def test_every_tool_shape_is_the_same_proto(tool: object) -> None:
    msg = RequestSpec(messages=[("user", "x")], tools=[tool]).to_proto("r")  # type: ignore[list-item]
    assert [(t.name, t.description, json.loads(t.parameters)) for t in msg.tools] == [("w", "d", PARAMS)]


@pytest.mark.parametrize(("choice", "mode", "function"), [
    (None, pb.TOOL_CHOICE_UNSPECIFIED, ""), ("auto", pb.TOOL_CHOICE_AUTO, ""),
    ("required", pb.TOOL_CHOICE_REQUIRED, ""), ("none", pb.TOOL_CHOICE_NONE, ""),
    ("w", pb.TOOL_CHOICE_FUNCTION, "w"), ({"name": "w"}, pb.TOOL_CHOICE_FUNCTION, "w"),
    ({"type": "function", "function": {"name": "w"}}, pb.TOOL_CHOICE_FUNCTION, "w"),
])
def test_tool_choice_becomes_the_enum_and_the_function(choice: object, mode: int, function: str) -> None:
    msg = RequestSpec(messages=[("user", "x")], tools=[{"name": "w"}], tool_choice=choice).to_proto("r")  # type: ignore[arg-type]
    assert (msg.tool_choice, msg.tool_choice_function) == (mode, function)
    assert not msg.HasField("parallel_tool_calls")


def test_parallel_and_earlier_calls_and_results_reach_the_proto() -> None:
    history = [{"role": "assistant", "content": None, "tool_calls": [
                   ToolCall("call_1", "w", '{"city": "Oslo"}'),
                   {"id": "call_2", "type": "function", "function": {"name": "w", "arguments": '{"city": "Rome"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "name": "w", "content": "sunny"}]
    msg = RequestSpec(messages=history, tools=[{"name": "w"}], parallel_tool_calls=False).to_proto("r")
    assert msg.HasField("parallel_tool_calls") and not msg.parallel_tool_calls
    assert [(c.id, c.name, c.arguments) for c in msg.messages[0].tool_calls] == [
        ("call_1", "w", '{"city": "Oslo"}'), ("call_2", "w", '{"city": "Rome"}')]
    assert (msg.messages[1].tool_call_id, msg.messages[1].name, msg.messages[1].content) == ("call_1", "w", "sunny")


def test_count_tokens_sends_tools_and_the_choice_but_not_a_function_name() -> None:
    req = count_request(messages=[("user", "x")], tools=[{"name": "w"}], tool_choice="w")
    assert [t.name for t in req.tools] == ["w"] and req.tool_choice == pb.TOOL_CHOICE_FUNCTION
