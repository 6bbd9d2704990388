"""One assistant turn as neutral pieces, and the writers of the Anthropic and Responses dialects over them:
event order, exactly one terminal event (also for a failure or a run that ends without its end), the whole
object equal to what the events spell, and which stop string ended a turn."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from inference.v1 import inference_pb2 as pb

from service.chat.calls import Function, ToolCall
from service.chat.families import GENERIC
from service.http.answer import Answer
from service.http.anthropic_stream import MessageWriter
from service.http.render import Choices
from service.http.requests import Output
from service.http.responses_stream import ResponseWriter
from service.http.tools import plan_functions
from service.http.turn import Call, End, Text, Turn, Usage, matched_stop, stream, whole
from tests.support.tool_formats import GENERIC_FORMAT

ADD = Function("add", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
ANTHROPIC_TERMINAL = {"message_stop", "error"}
RESPONSES_TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
CALL_A4 = GENERIC.syntax.render([ToolCall("add", '{"a": 4}')])  # the generic family's syntax


class NoGrammar:
    """These turns have no JSON Schema, so the final validation never asks for a grammar."""

    async def compiled(self, kind: str, source: str, record: bool = True) -> Any:
        raise AssertionError("no schema here")

    def validate(self, compiled: Any, text: str) -> None:
        raise AssertionError("no schema here")


def delta(text: str, ids: tuple[int, ...] = ()) -> pb.GenerateResponse:
    return pb.GenerateResponse(delta=pb.Delta(text=text, token_ids=list(ids)))


def done(reason: int = pb.FINISH_REASON_STOP, prompt: int = 7, completion: int = 3, cached: int = 2) -> pb.GenerateResponse:
    usage = pb.Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    return pb.GenerateResponse(done=pb.Done(finish_reason=reason, usage=usage))


def error(status: str = "UNAUTHENTICATED", message: str = "token no longer valid") -> pb.GenerateResponse:
    return pb.GenerateResponse(error=pb.Error(status=status, message=message))


async def feed(events: list[pb.GenerateResponse]) -> AsyncIterator[pb.GenerateResponse]:
    for ev in events:
        yield ev


def turn(tools: bool = False, **kw: Any) -> Turn:
    plan = plan_functions([ADD], "auto") if tools else None
    plan = replace(plan, fmt=GENERIC_FORMAT) if plan is not None else None
    return Turn(Answer(Choices(Output(True, "m", tools=plan), "rid"), NoGrammar()), **kw)


async def pieces(t: Turn, events: list[pb.GenerateResponse]) -> list[Any]:
    return [p async for p in t.pieces(feed(events))]


async def test_text_streams_as_released_and_ends_with_usage() -> None:
    got = await pieces(turn(), [delta("Hel"), delta("lo"), done()])
    assert got == [Text("Hel"), Text("lo"), End("stop", Usage(7, 3, 2))]


async def test_auto_tool_output_becomes_one_validated_call() -> None:
    text = GENERIC.syntax.render([ToolCall("add", '{"a": 1}')])
    got = await pieces(turn(tools=True), [delta(text[:14]), delta(text[14:40]), delta(text[40:]), done()])
    assert len(got) == 2 and isinstance(got[0], Call) and got[1].finish == "tool_calls"
    assert (got[0].name, json.loads(got[0].arguments)) == ("add", {"a": 1}) and got[0].call_id.startswith("call_")


async def test_plain_text_with_tools_offered_streams_as_text() -> None:
    got = await pieces(turn(tools=True), [delta("It"), delta(" is 2."), done()])
    assert got == [Text("It"), Text(" is 2."), End("stop", Usage(7, 3, 2))]


def test_matched_stop_reads_the_stop_string_from_the_tokens_after_the_text() -> None:
    vocab = [b"He", b"llo", b" wor", b"ld", b""]
    assert matched_stop(vocab, [0, 1, 2], "Hello", [" w", "x"]) == " w"
    assert matched_stop(vocab, [0, 1], "Hello", [" w"]) is None  # nothing follows: end of generation
    assert matched_stop(vocab, [0, 1, 2], "Hello", []) is None


def test_matched_stop_finds_the_stop_string_after_a_reasoning_models_answer() -> None:
    vocab = [b"<think>", b"hm", b"</think>", b"\n\nHe", b"llo", b" wor"]
    assert matched_stop(vocab, [0, 1, 2, 3, 4, 5], "Hello", [" w"]) == " w"  # the answer after the thought
    assert matched_stop(vocab, [0, 1, 2, 3, 4], "Hello", [" w"]) is None


async def test_turn_reports_its_stop_sequence() -> None:
    t = turn(stops=("lo",), token_bytes=[b"Hel", b"lo"])
    got = await pieces(t, [delta("Hel", (0, 1)), done()])
    assert got[-1] == End("stop", Usage(7, 3, 2), "lo")


def anthropic_events(events: list[pb.GenerateResponse], tools: bool = False) -> Any:
    return stream(MessageWriter("msg_1", "m"), turn(tools=tools), feed(events))


def responses_events(events: list[pb.GenerateResponse], tools: bool = False) -> Any:
    return stream(ResponseWriter("resp_1", "m", {}), turn(tools=tools), feed(events))


async def test_anthropic_stream_orders_blocks_and_ends_with_one_message_stop() -> None:
    evs = [e async for e in anthropic_events([delta("Hi"), delta("!"), done(pb.FINISH_REASON_LENGTH)])]
    assert [e["type"] for e in evs] == ["message_start", "content_block_start", "content_block_delta",
                                        "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert evs[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert evs[-2]["usage"] == {"input_tokens": 5, "output_tokens": 3, "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 2}


async def test_anthropic_tool_use_block_carries_its_input_as_one_json_delta() -> None:
    evs = [e async for e in anthropic_events([delta(CALL_A4), done()], tools=True)]
    start = next(e for e in evs if e["type"] == "content_block_start")["content_block"]
    assert start["type"] == "tool_use" and start["name"] == "add" and start["id"].startswith("toolu_")
    partial = [e["delta"]["partial_json"] for e in evs if e["type"] == "content_block_delta"]
    assert [json.loads(p) for p in partial] == [{"a": 4}]
    assert evs[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("tail", [[error()], [done(pb.FINISH_REASON_CANCELLED)], []])
async def test_a_failure_or_a_lost_end_is_the_one_terminal_event(tail: list[pb.GenerateResponse]) -> None:
    a = [e async for e in anthropic_events([delta("Hi"), *tail])]
    assert [e["type"] for e in a if e["type"] in ANTHROPIC_TERMINAL] == ["error"] and a[-1]["type"] == "error"
    assert a[-1]["error"]["type"] in ("authentication_error", "overloaded_error")
    r = [e async for e in responses_events([delta("Hi"), *tail])]
    assert [e["type"] for e in r if e["type"] in RESPONSES_TERMINAL] == ["response.failed"]
    assert r[-1]["response"]["status"] == "failed" and r[-1]["response"]["error"]["message"]


async def test_responses_stream_numbers_every_event_and_spells_the_final_response() -> None:
    evs = [e async for e in responses_events([delta("Hi"), delta(" there"), done()])]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert [e["type"] for e in evs] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    final = evs[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Hi there" == evs[6]["text"]
    assert final["usage"]["total_tokens"] == 10 and final["usage"]["input_tokens_details"]["cached_tokens"] == 2


async def test_responses_call_item_and_incomplete_status() -> None:
    evs = [e async for e in responses_events([delta(CALL_A4), done()], tools=True)]
    item = evs[-1]["response"]["output"][0]
    assert item["type"] == "function_call" and json.loads(item["arguments"]) == {"a": 4}
    assert [e["type"] for e in evs if "function_call_arguments" in e["type"]] == [
        "response.function_call_arguments.delta", "response.function_call_arguments.done"]
    cut = [e async for e in responses_events([delta("Hi"), done(pb.FINISH_REASON_LENGTH)])]
    assert cut[-1]["type"] == "response.incomplete"
    assert cut[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_whole_answer_equals_what_the_stream_spells() -> None:
    events = [delta("Hi"), delta(" there"), done()]
    message = await whole(MessageWriter("msg_1", "m"), turn(), feed(events))
    assert message is not None and message["content"] == [{"type": "text", "text": "Hi there"}]
    assert message["stop_reason"] == "end_turn"
    response = await whole(ResponseWriter("resp_1", "m", {}), turn(), feed(events))
    assert response is not None and response["status"] == "completed"
    assert response["output"][0]["status"] == "completed"
    assert await whole(MessageWriter("msg_1", "m"), turn(), feed([delta("Hi")])) is None  # the client left


async def test_text_then_two_calls_are_a_text_block_and_two_tool_uses_or_items() -> None:
    text = "Adding." + GENERIC.syntax.render([ToolCall("add", '{"a": 1}'), ToolCall("add", '{"a": 2}')])
    events = [delta(text[:20]), delta(text[20:]), done()]
    message = await whole(MessageWriter("msg_1", "m"), turn(tools=True), feed(events))
    assert message is not None and [b["type"] for b in message["content"]] == ["text", "tool_use", "tool_use"]
    assert message["content"][0]["text"] == "Adding." and [b["input"] for b in message["content"][1:]] == [
        {"a": 1}, {"a": 2}] and message["stop_reason"] == "tool_use"
    response = await whole(ResponseWriter("resp_1", "m", {}), turn(tools=True), feed(events))
    assert response is not None and [i["type"] for i in response["output"]] == [
        "message", "function_call", "function_call"]
    assert len({i["call_id"] for i in response["output"][1:]}) == 2
