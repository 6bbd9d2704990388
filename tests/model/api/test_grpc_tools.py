"""Tools on gRPC through the generated stubs: calls forced by ``tool_choice`` come back parsed and valid
(streamed in ``Delta.tool_calls``, repeated in ``Done.tool_calls``, finish TOOL_CALLS), a conversation
with two calls, two results and a follow-up, Tokenize/CountTokens with tools equal to Generate's
``prompt_tokens``, and a call that breaks a keyword the grammar cannot enforce ends INVALID_ARGUMENT."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import jsonschema
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.server import start_server

pytestmark = pytest.mark.model
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [pb.Tool(name="get_weather", description="Current weather of a city", parameters=json.dumps(WEATHER)),
         pb.Tool(name="get_time", description="Current time in a city", parameters=json.dumps(TIME))]
ASK = [pb.ChatMessage(role="system", content="You call tools to answer."),
       pb.ChatMessage(role="user", content="Weather and time in Oslo?")]
# Every array the grammar allows repeats "a": it breaks uniqueItems, which no grammar here enforces.
REPEATS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a"]}, "minItems": 2,
                                                     "maxItems": 2, "uniqueItems": True}},
           "required": ["tags"], "additionalProperties": False}


def generate(channel: grpc.Channel, **fields: Any) -> list[pb.GenerateResponse]:
    """One request's events (every message of its stream)."""
    fields.setdefault("sampling", pb.SamplingParams(max_tokens=160, temperature=0.0))
    request = pb.GenerateRequest(request_id="r", **fields)
    return list(pb_grpc.InferenceServiceStub(channel).Generate(iter([request])))


def calls_of(events: list[pb.GenerateResponse]) -> tuple[list[pb.ToolCall], pb.Done]:
    """The calls streamed in deltas, and the one terminal Done (asserted)."""
    assert [e.WhichOneof("event") for e in events][-1] == "done"
    assert sum(e.WhichOneof("event") != "delta" for e in events) == 1
    streamed = [c for e in events if e.WhichOneof("event") == "delta" for c in e.delta.tool_calls]
    return streamed, events[-1].done


def assert_valid(call: pb.ToolCall) -> None:
    assert call.id.startswith("call_") and call.name in SCHEMAS
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_required_calls_come_back_parsed_validated_and_streamed_as_done_repeats_them(channel: grpc.Channel) -> None:
    events = generate(channel, messages=ASK, tools=TOOLS, tool_choice=pb.TOOL_CHOICE_REQUIRED)
    streamed, done = calls_of(events)
    assert done.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert len(streamed) >= 1 and list(done.tool_calls) == streamed  # several: the cut-off test below
    for call in streamed:
        assert_valid(call)
    assert len({c.id for c in streamed}) == len(streamed)
    text = "".join(e.delta.text for e in events if e.WhichOneof("event") == "delta")
    assert "<tool_call>" not in text and "get_weather" not in text  # the call syntax is held back


def test_a_choice_cut_off_by_max_tokens_lists_only_the_calls_completed_before(channel: grpc.Channel) -> None:
    """The end-of-turn tokens banned, the grammar can only go on with another call until max_tokens cuts one:
    the calls before it were sent and are listed, the cut one never is."""
    stub = pb_grpc.InferenceServiceStub(channel)
    ends = {t.token_id: -100.0 for t in stub.GetModelInfo(pb.GetModelInfoRequest()).special_tokens
            if t.name in ("eos", "eot")}
    cut = generate(channel, messages=ASK, tools=TOOLS, tool_choice=pb.TOOL_CHOICE_REQUIRED,
                   sampling=pb.SamplingParams(max_tokens=120, temperature=0.0, logit_bias=ends))
    streamed, done = calls_of(cut)
    assert done.finish_reason == pb.FINISH_REASON_LENGTH and done.usage.completion_tokens == 120
    assert len(streamed) >= 2 and list(done.tool_calls) == streamed
    for call in streamed:
        assert_valid(call)
    text = "".join(e.delta.text for e in cut if e.WhichOneof("event") == "delta")
    assert "<tool_call>" not in text  # the unfinished call is neither text nor a call


def test_a_named_function_is_called_exactly_once(channel: grpc.Channel) -> None:
    events = generate(channel, messages=ASK, tools=TOOLS, tool_choice=pb.TOOL_CHOICE_FUNCTION,
                      tool_choice_function="get_time")
    streamed, done = calls_of(events)
    assert done.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert [c.name for c in done.tool_calls] == ["get_time"] and list(done.tool_calls) == streamed
    assert_valid(streamed[0])


def test_a_conversation_with_two_calls_two_results_and_a_follow_up(channel: grpc.Channel) -> None:
    weather = generate(channel, messages=ASK, tools=TOOLS, tool_choice=pb.TOOL_CHOICE_FUNCTION,
                       tool_choice_function="get_weather")
    time = generate(channel, messages=ASK, tools=TOOLS, tool_choice=pb.TOOL_CHOICE_FUNCTION,
                    tool_choice_function="get_time")
    calls = [*calls_of(weather)[1].tool_calls, *calls_of(time)[1].tool_calls]
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    history = [*ASK, pb.ChatMessage(role="assistant", tool_calls=calls),
               pb.ChatMessage(role="tool", tool_call_id=calls[0].id, name="get_weather", content="12 C and sunny"),
               pb.ChatMessage(role="tool", tool_call_id=calls[1].id, name="get_time", content="14:05"),
               pb.ChatMessage(role="user", content="So, should I take a coat?")]
    tokens = pb_grpc.InferenceServiceStub(channel).Tokenize(pb.TokenizeRequest(messages=history, tools=TOOLS))
    for piece in ("get_weather", "get_time", "12 C and sunny", "14:05", json.loads(calls[1].arguments)["city"]):
        assert piece in tokens.prompt
    follow = generate(channel, messages=history, tools=TOOLS, tool_choice=pb.TOOL_CHOICE_NONE,
                      sampling=pb.SamplingParams(max_tokens=24, temperature=0.0))
    streamed, done = calls_of(follow)
    assert not streamed and not done.tool_calls
    assert done.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert "".join(e.delta.text for e in follow[:-1]).strip()


@pytest.mark.parametrize("choice", [pb.TOOL_CHOICE_AUTO, pb.TOOL_CHOICE_REQUIRED, pb.TOOL_CHOICE_NONE])
def test_tokenize_and_count_tokens_with_tools_equal_generates_prompt_tokens(channel: grpc.Channel,
                                                                             choice: int) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    kwargs = json.dumps({"city_hint": "Oslo"})
    done = generate(channel, messages=ASK, tools=TOOLS, tool_choice=choice, chat_template_kwargs=kwargs,
                    sampling=pb.SamplingParams(max_tokens=1, temperature=0.0))[-1].done
    tokens = stub.Tokenize(pb.TokenizeRequest(messages=ASK, tools=TOOLS, tool_choice=choice,
                                              chat_template_kwargs=kwargs))
    count = stub.CountTokens(pb.CountTokensRequest(messages=ASK, tools=TOOLS, tool_choice=choice,
                                                   chat_template_kwargs=kwargs))
    assert len(tokens.token_ids) == count.count == done.usage.prompt_tokens
    without = stub.CountTokens(pb.CountTokensRequest(messages=ASK)).count
    assert (count.count == without) == (choice == pb.TOOL_CHOICE_NONE)  # "none" leaves the tools out


def test_a_call_that_breaks_unique_items_ends_invalid_argument_schema_not_enforced(channel: grpc.Channel) -> None:
    tools = [pb.Tool(name="tag", parameters=json.dumps(REPEATS))]
    events = generate(channel, messages=ASK, tools=tools, tool_choice=pb.TOOL_CHOICE_REQUIRED)
    assert [e.WhichOneof("event") for e in events][-1] == "error"
    assert sum(e.WhichOneof("event") != "delta" for e in events) == 1
    err = events[-1].error
    assert (err.status, err.code, err.reason) == ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                  "schema_not_enforced")
    assert err.message.startswith("tools[0].parameters: the model's output broke `uniqueItems` at /tags, a keyword")
    assert not [c for e in events if e.WhichOneof("event") == "delta" for c in e.delta.tool_calls]


@pytest.mark.parametrize(("fields", "needle"), [
    ({"tool_choice": pb.TOOL_CHOICE_REQUIRED}, "need tools"),
    ({"tools": TOOLS, "tool_choice": pb.TOOL_CHOICE_FUNCTION, "tool_choice_function": "nope"}, "not one of the tools"),
    ({"tools": TOOLS, "tool_choice": pb.TOOL_CHOICE_FUNCTION}, "tool_choice_function"),
    ({"tools": TOOLS, "tool_choice": pb.TOOL_CHOICE_REQUIRED, "response_format": pb.ResponseFormat(regex="a+")},
     "response_format"),
    ({"tools": [pb.Tool(name="f", parameters='{"type": 5}')]}, "tools[0].parameters is not a valid JSON Schema"),
])
def test_bad_tool_fields_are_invalid_argument_naming_them(channel: grpc.Channel, fields: dict[str, Any],
                                                          needle: str) -> None:
    events = generate(channel, messages=ASK, **fields)
    assert len(events) == 1 and events[0].error.status == "INVALID_ARGUMENT" and needle in events[0].error.message


@pytest.fixture(scope="module")
def cached_channel() -> Iterator[grpc.Channel]:
    srv = start_server(response_cache_bytes=1 << 20)
    try:
        with grpc.insecure_channel(srv.target) as ch:
            yield ch
    finally:
        srv.close()


def test_a_cache_hit_replays_the_same_calls_and_the_tool_choice_is_part_of_the_key(
        cached_channel: grpc.Channel) -> None:
    fields: dict[str, Any] = {"messages": ASK, "tools": TOOLS, "tool_choice": pb.TOOL_CHOICE_REQUIRED}
    first_calls, first = calls_of(generate(cached_channel, **fields))
    again_calls, again = calls_of(generate(cached_channel, **fields))
    assert again.cache_hit and not first.cache_hit
    assert again.finish_reason == first.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert [(c.name, c.arguments) for c in again_calls] == [(c.name, c.arguments) for c in first_calls]
    assert {c.id for c in again_calls}.isdisjoint(c.id for c in first_calls)  # each answer's own ids
    named = generate(cached_channel, **{**fields, "tool_choice": pb.TOOL_CHOICE_FUNCTION,
                                        "tool_choice_function": "get_time"})
    assert not calls_of(named)[1].cache_hit  # another grammar: another answer
