"""Anthropic Messages bodies -> the shared chat request: turns, tools, sampling, formats; every bad field a 400
naming it; Anthropic's error shape and statuses (also from a front end whose model is still loading)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from inference.v1 import inference_pb2 as pb

from service.api.cache_front import CacheFront
from service.api.intake import Intake
from service.http.anthropic_errors import anthropic_response
from service.http.anthropic_messages import count_turns, parse_messages
from service.http.config import HttpConfig
from service.http.errors import ApiError, from_status
from service.http.requests import Parsed, parse_chat, with_format
from service.http.server import HttpFrontEnd
from service.observability.telemetry import Telemetry
from service.security.tenancy import Tenancy
from tests.support.tool_formats import GENERIC_FORMAT

USER = [{"role": "user", "content": "Weather in Oslo?"}]
WEATHER = {"name": "get_weather", "description": "weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def parse(**kw: Any) -> Parsed:
    return parse_messages({"model": "m", "max_tokens": 16, "messages": USER, **kw}, "m", None)


def refused(**kw: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(**kw)
    assert info.value.status == 400
    return info.value


def test_system_blocks_and_turns_map_onto_the_templates_roles() -> None:
    p = parse(system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief.", "cache_control": {
        "type": "ephemeral"}}], messages=[*USER, {"role": "assistant", "content": [{"type": "text", "text": "Sunny"}]},
                                         {"role": "user", "content": "Thanks"}])
    assert [(m.role, m.content) for m in p.request.messages] == [
        ("system", "Be brief."), ("user", "Weather in Oslo?"), ("assistant", "Sunny"), ("user", "Thanks")]


def test_sampling_fields_map_onto_the_proto() -> None:
    p = parse(temperature=0.5, top_p=0.9, top_k=7, stop_sequences=["\n\n", "END"], stream=True)
    sp = p.request.sampling
    assert (sp.max_tokens, sp.temperature, sp.top_k, list(sp.stop)) == (16, 0.5, 7, ["\n\n", "END"])
    assert abs(sp.top_p - 0.9) < 1e-6 and p.output.stream
    assert parse(top_p=0).request.sampling.top_k == 1  # top_p 0: greedy, as the chat route treats it


def test_tool_history_and_its_thought_render_as_the_chat_route_renders_them() -> None:
    history = [*USER, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "x"},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    ours = parse(messages=history).request.messages
    chat = parse_chat({"model": "m", "messages": [*USER, {"role": "assistant", "content": None,
                                                          "reasoning_content": "hmm", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}]}, "m", None).request.messages
    assert list(ours) == list(chat)


@pytest.mark.parametrize(("choice", "mode"), [
    (None, "auto"), ({"type": "auto"}, "auto"), ({"type": "any"}, "required"),
    ({"type": "tool", "name": "get_weather"}, "named")])
def test_tool_choice_maps_onto_the_shared_tool_plan(choice: Any, mode: str) -> None:
    p = parse(tools=[WEATHER], **({"tool_choice": choice} if choice else {}))
    assert p.output.tools is not None and p.output.tools.mode == mode
    assert [t.name for t in p.request.tools] == ["get_weather"] and [m.role for m in p.request.messages] == ["user"]
    grammar = with_format(p, GENERIC_FORMAT).request.response_format.lark_grammar
    assert grammar.startswith("start: calls" if mode != "auto" else "start: TEXT | head calls")


def test_disable_parallel_tool_use_asks_for_one_call() -> None:
    one = with_format(parse(tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
                      GENERIC_FORMAT)
    many = with_format(parse(tools=[WEATHER], tool_choice={"type": "any"}), GENERIC_FORMAT)
    assert one.output.tools is not None and not one.output.tools.parallel
    assert "call)*" in many.request.response_format.lark_grammar
    assert "call)*" not in one.request.response_format.lark_grammar


def test_tool_choice_none_leaves_the_tools_out() -> None:
    p = parse(tools=[WEATHER], tool_choice={"type": "none"})
    assert p.output.tools is None and [m.role for m in p.request.messages] == ["user"]


def test_output_config_format_is_a_validated_json_schema() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    p = parse(output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}})
    assert json.loads(p.request.response_format.json_schema) == schema and p.output.schema is not None


def test_the_thinking_config_becomes_enable_thinking_and_the_thinking_budget() -> None:
    p = parse(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024})
    assert p.request.sampling.max_tokens == 2048 and p.request.sampling.thinking_budget_tokens == 1024
    assert json.loads(p.request.chat_template_kwargs) == {"enable_thinking": True}
    off = parse(max_tokens=2048, thinking={"type": "disabled"}).request
    assert off.sampling.thinking_budget_tokens == 0 and json.loads(off.chat_template_kwargs) == {"enable_thinking": False}
    adaptive = parse(max_tokens=2048, thinking={"type": "adaptive"}).request
    assert not adaptive.sampling.HasField("thinking_budget_tokens")
    assert not parse(max_tokens=2048).request.chat_template_kwargs
    assert refused(max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 1024}).param == \
        "thinking.budget_tokens"


@pytest.mark.parametrize(("kw", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "messages[0].name"),
    ({"system": [{"type": "image"}]}, "system[0]"),
    ({"stop_sequences": [1]}, "stop_sequences"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "a b", "input_schema": {}}]}, "tools[0].name"),
    ({"tools": [{"name": "a"}]}, "tools[0].input_schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"thinking": {"type": "maybe"}}, "thinking.type"),
    ({"container": "c1"}, "container"),
    ({"bogus": 1}, "bogus"),
    ({"tools": [WEATHER], "output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config.format"),
])
def test_bad_fields_are_400_naming_them(kw: dict[str, Any], param: str) -> None:
    assert refused(**kw).param == param


def test_count_tokens_turns_include_the_tools() -> None:
    plain, none, variables = count_turns({"model": "m", "messages": USER})
    turns, tools, _ = count_turns({"model": "m", "messages": USER, "tools": [WEATHER]})
    assert [m.role for m in plain] == [m.role for m in turns] == ["user"] and none == [] and variables == ""
    thinking = count_turns({"model": "m", "messages": USER, "thinking": {"type": "disabled"}})[2]
    assert json.loads(thinking) == {"enable_thinking": False}  # as the message itself renders
    assert [t.name for t in tools] == ["get_weather"] and json.loads(tools[0].parameters)["required"] == ["city"]
    with pytest.raises(ApiError) as info:
        count_turns({"model": "m", "messages": USER, "max_tokens": 5})  # not a count_tokens field
    assert info.value.param == "max_tokens"


@pytest.mark.parametrize(("error", "status", "kind"), [
    (ApiError(400, "bad"), 400, "invalid_request_error"),
    (from_status("UNAUTHENTICATED", "no"), 401, "authentication_error"),
    (from_status("PERMISSION_DENIED", "no"), 403, "permission_error"),
    (ApiError(404, "no model", code="model_not_found"), 404, "not_found_error"),
    (ApiError(413, "big"), 413, "request_too_large"),
    (from_status("RESOURCE_EXHAUSTED", "quota", quota="tokens_per_minute"), 429, "rate_limit_error"),
    (from_status("RESOURCE_EXHAUSTED", "queue full", 500), 529, "overloaded_error"),
    (ApiError(500, "bug", type="server_error"), 500, "api_error"),
    (from_status("UNAVAILABLE", "draining", reason="draining"), 503, "overloaded_error"),
])
def test_errors_take_anthropics_shape_and_status(error: ApiError, status: int, kind: str) -> None:
    r = anthropic_response(error)
    assert r.status_code == status
    assert json.loads(bytes(r.body)) == {"type": "error", "error": {"type": kind, "message": str(error)}}
    if status in (503, 529):
        assert r.headers["retry-after"] == "1"


def test_a_streamed_body_is_the_same_request_with_stream_set() -> None:
    a, b = parse(), parse(stream=True)
    assert a.request == b.request and (a.output.stream, b.output.stream) == (False, True)
    assert isinstance(a.request, pb.GenerateRequest)


async def test_while_loading_each_dialect_refuses_503_in_its_own_shape() -> None:
    intake = Intake(Telemetry(), Tenancy(), CacheFront(None))  # never attached: "loading"
    front = HttpFrontEnd(HttpConfig(host="127.0.0.1", port=0, model_name="m"), intake, Tenancy())
    port = await front.start()
    try:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses"):
                r = await http.post(path, json={"model": "m", "max_tokens": 4, "messages": USER})
                assert r.status_code == 503 and r.headers["retry-after"] == "1", path
                assert r.headers["inference-unavailable-reason"] == "loading"
                anthropic = path.startswith("/v1/messages")
                kind = r.json()["error"]["type"]
                assert kind == ("overloaded_error" if anthropic else "service_unavailable_error")
                assert (r.json().get("type") == "error") is anthropic
    finally:
        await front.stop()
