"""The Python client with tools (sync and asyncio): tools and tool choice in, ``ToolCall``s out
(``Delta.tool_calls``, ``Done.tool_calls``, ``Result.tool_calls``), a round trip with the calls and their
results sent back, and ``count_tokens``/``tokenize`` with tools equal to Generate's prompt tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from inference_client import AsyncInferenceClient, Delta, Done, InferenceClient, InferenceError, ToolCall

pytestmark = pytest.mark.model
WEATHER = {"type": "function", "function": {  # OpenAI's shape
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"name": "get_time", "description": "Current time in a city",  # the flat shape
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "Weather and time in Oslo?"}]
SCHEMA = WEATHER["function"]["parameters"]  # both functions take the same arguments


@pytest.fixture()
def client(server: Any) -> Iterator[InferenceClient]:
    with InferenceClient(server.target, timeout=600) as c:
        yield c


def test_generate_with_required_tools_gives_tool_calls(client: InferenceClient) -> None:
    events = list(client.generate(messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=160,
                                  temperature=0))
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "tool_calls"
    streamed = [c for e in events if isinstance(e, Delta) for c in e.tool_calls]
    assert streamed == list(done.tool_calls) and len(streamed) >= 1
    for call in streamed:
        assert isinstance(call, ToolCall) and call.id.startswith("call_")
        assert call.name in ("get_weather", "get_time")
        jsonschema.validate(call.args, SCHEMA)


def test_a_named_function_round_trip_and_counts(client: InferenceClient) -> None:
    result = client.generate(messages=ASK, tools=[WEATHER, TIME], tool_choice="get_time", max_tokens=160,
                             temperature=0).result()
    assert result.done is not None and result.done.finish_reason == "tool_calls"
    assert [c.name for c in result.tool_calls] == ["get_time"] and result.text == ""
    call = result.tool_calls[0]
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": call.id, "name": "get_time", "content": "14:05"}]
    follow = client.generate(messages=history, tools=[WEATHER, TIME], tool_choice="none", max_tokens=8,
                             temperature=0).result()
    assert follow.done is not None and not follow.tool_calls and follow.text
    count = client.count_tokens(messages=history, tools=[WEATHER, TIME], tool_choice="none").count
    assert count == follow.done.usage.prompt_tokens
    tokens = client.tokenize(messages=ASK, tools=[WEATHER, TIME])
    assert len(tokens.token_ids) == result.done.usage.prompt_tokens and "get_time" in tokens.prompt


def test_a_bad_tool_choice_is_invalid_argument(client: InferenceClient) -> None:
    with pytest.raises(InferenceError) as info:
        client.generate(messages=ASK, tools=[WEATHER], tool_choice="nope", max_tokens=8).result()
    assert info.value.status == "INVALID_ARGUMENT" and "not one of the tools" in info.value.message


async def test_the_async_client_gives_one_call_without_parallel_calls(server: Any) -> None:
    kw: dict[str, Any] = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required", "max_tokens": 96,
                          "temperature": 0, "parallel_tool_calls": False}
    async with AsyncInferenceClient(server.target, timeout=600) as aclient:
        events = [e async for e in aclient.generate(**kw)]
        count = (await aclient.count_tokens(messages=ASK, tools=[WEATHER, TIME])).count
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "tool_calls" and len(done.tool_calls) == 1
    assert [c for e in events if isinstance(e, Delta) for c in e.tool_calls] == list(done.tool_calls)
    jsonschema.validate(done.tool_calls[0].args, SCHEMA)
    assert count == done.usage.prompt_tokens


def test_a_call_that_breaks_unique_items_raises_schema_not_enforced(client: InferenceClient) -> None:
    repeats = {"type": "object", "required": ["tags"], "additionalProperties": False, "properties": {
        "tags": {"type": "array", "items": {"enum": ["a"]}, "minItems": 2, "maxItems": 2, "uniqueItems": True}}}
    with pytest.raises(InferenceError) as info:
        client.generate(messages=ASK, tools=[{"name": "tag", "parameters": repeats}], tool_choice="required",
                        max_tokens=64, temperature=0).result()
    assert (info.value.status, info.value.reason) == ("INVALID_ARGUMENT", "schema_not_enforced")
    assert "broke `uniqueItems` at /tags" in info.value.message
