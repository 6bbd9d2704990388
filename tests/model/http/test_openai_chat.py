"""The official OpenAI SDK against the HTTP API: chat and completions, streamed and not, n, logprobs,
structured output through the SDK's parse helper, tool calls, and the SDK's error class per failure."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import openai
import pytest
from pydantic import BaseModel, Field

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model
HI = [{"role": "user", "content": "Say hello."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_completion_streamed_and_unstreamed_give_the_same_greedy_text(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.usage is not None
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    usage, want = chunks[-1].usage, whole.usage
    assert chunks[-1].choices == [] and usage is not None and want is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (want.prompt_tokens, want.completion_tokens)


def test_completion_with_n_and_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, n=3, temperature=0.9, seed=11,
                                  logprobs=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    for c in r.choices:
        lp = c.logprobs
        assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
        assert "".join(lp.tokens) == c.text and all(x <= 0 for x in lp.token_logprobs)
        assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    assert r.usage is not None and r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)


def test_chat_logprobs_bytes_spell_the_text(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert content is not None and len(content) == r.usage.completion_tokens
    assert bytes(b for e in content for b in e.bytes).decode() == r.choices[0].message.content
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in content)


async def test_async_client_streams_concurrent_requests(aclient: openai.AsyncOpenAI) -> None:
    async def one(i: int) -> str:
        stream = await aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=8, temperature=0,
            stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream])

    texts = await asyncio.gather(*(one(i) for i in range(4)))
    assert all(texts)
    assert (await aclient.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=3, temperature=0)).choices


class City(BaseModel):
    name: str = Field(max_length=24)
    population: int = Field(ge=0, le=10**9)


def test_structured_output_through_the_sdks_parse_helper(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(model=MODEL, response_format=City, max_tokens=128, temperature=0,
                                      messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    parsed = r.choices[0].message.parsed
    assert r.choices[0].finish_reason == "stop" and isinstance(parsed, City)


def test_cut_off_json_is_finish_length_and_never_parsed(client: openai.OpenAI) -> None:
    # NOTE: closing within the budget is the default; json_finish "cut-off" asks for a cut-off document
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model=MODEL, response_format=City, max_tokens=3, temperature=0,
                                      messages=[{"role": "user", "content": "Describe Paris as JSON."}],
                                      extra_body={"json_finish": "cut-off"})


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call_arguments_validate(client: openai.OpenAI, choice: object) -> None:
    r = client.chat.completions.create(model=MODEL, tools=[WEATHER], tool_choice=choice, max_tokens=64, temperature=0,
                                       parallel_tool_calls=False,
                                       messages=[{"role": "user", "content": "Weather in Oslo?"}])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None and msg.tool_calls
    assert len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(args) == {"city", "unit"} and args["unit"] in ("C", "F")


def accumulate(chunks: list[Any]) -> dict[int, dict[str, str]]:
    """Streamed tool calls gathered as OpenAI's SDK helpers and agent frameworks gather them: the first delta of
    an index brings id and name, later ones pieces of the arguments."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            if tc.id:
                assert not call["id"] and tc.type == "function" and tc.function.name  # the first delta only
                call["id"], call["name"] = tc.id, tc.function.name
            call["arguments"] += tc.function.arguments or ""
    return calls


def test_streamed_tool_calls_accumulate_to_the_unstreamed_calls(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 160, "temperature": 0,
          "messages": [{"role": "user", "content": "Weather in Oslo and in Rome?"}]}
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(**kw, stream=True))  # type: ignore[call-overload]
    calls = accumulate(chunks)
    want = whole.choices[0].message.tool_calls or []
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (t.function.name, t.function.arguments) for t in want]
    assert len(calls) >= 1 and all(set(json.loads(c["arguments"])) == {"city", "unit"} for c in calls.values())
    pieces = sum(1 for c in chunks if c.choices and c.choices[0].delta.tool_calls)
    assert pieces > len(calls)  # the arguments arrive in pieces, not whole
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_several_in_one_answer_each_valid(client: openai.OpenAI) -> None:
    """Under the grammar every call of the answer is one of the tools with valid arguments; with
    ``parallel_tool_calls`` false there is exactly one."""
    time = {"type": "function", "function": {"name": "get_time", "description": "Current time in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    ask = [{"role": "user", "content": "Weather and time in Oslo?"}]
    many = client.chat.completions.create(model=MODEL, tools=[WEATHER, time], tool_choice="required", max_tokens=200,
                                          temperature=0, messages=ask)
    one = client.chat.completions.create(model=MODEL, tools=[WEATHER, time], tool_choice="required", max_tokens=200,
                                         temperature=0, messages=ask, parallel_tool_calls=False)
    assert many.choices[0].finish_reason == "tool_calls" and len(many.choices[0].message.tool_calls or []) >= 2
    assert one.choices[0].finish_reason == "tool_calls" and len(one.choices[0].message.tool_calls or []) == 1
    for call in [*(many.choices[0].message.tool_calls or []), *(one.choices[0].message.tool_calls or [])]:
        args = json.loads(call.function.arguments)
        assert call.function.name in ("get_weather", "get_time") and "city" in args
    ids = [c.id for c in many.choices[0].message.tool_calls or []]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)


def test_a_tool_round_trip_renders_calls_and_results(client: openai.OpenAI, api_server: RunningServer) -> None:
    first = client.chat.completions.create(model=MODEL, tools=[WEATHER], tool_choice="required", max_tokens=64,
                                           temperature=0, parallel_tool_calls=False,
                                           messages=[{"role": "user", "content": "Weather in Oslo?"}])
    call = (first.choices[0].message.tool_calls or [])[0]
    history = [{"role": "user", "content": "Weather in Oslo?"}, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "12 C and sunny"}]
    body = {"model": MODEL, "tools": [WEATHER], "messages": history, "max_tokens": 24, "temperature": 0}
    with httpx2.Client(base_url=f"http://127.0.0.1:{api_server.server.http_port}", timeout=600) as http:
        prompt = http.post("/v1/chat/completions/render", json=body).json()["prompt"]
    # the default model's template renders neither tools nor calls: the server writes them, in its syntax
    assert '"name": "get_weather"' in prompt and "<tool_response>\n12 C and sunny\n</tool_response>" in prompt
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {json.dumps(json.loads(call.function.arguments))}}}' \
        in prompt
    second = client.chat.completions.create(**{**body, "tool_choice": "none"})  # type: ignore[arg-type]
    assert second.choices[0].message.content and second.choices[0].finish_reason in ("stop", "length")


def test_auto_tool_choice_answers_text_or_a_valid_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, tools=[WEATHER], max_tokens=96, temperature=0,
                                       messages=[{"role": "user", "content": "Weather in Oslo?"}])
    c = r.choices[0]
    if c.finish_reason == "tool_calls":
        assert set(json.loads(c.message.tool_calls[0].function.arguments)) == {"city", "unit"}
    else:
        assert c.message.tool_calls is None and "<tool_call>" not in (c.message.content or "")


def test_the_model_object_says_how_tools_reach_the_model_and_that_it_does_not_reason(client: openai.OpenAI) -> None:
    fmt = (client.models.retrieve(MODEL).model_extra or {})["chat_format"]
    assert fmt == {"family": "generic", "tools": "system_turn", "renders": ["system"], "parallel_tool_calls": True,
                   "reasoning": None}


@pytest.mark.parametrize(("kw", "param"), [
    ({"frequency_penalty": 2.7}, "frequency_penalty"), ({"logit_bias": {"42": 300}}, "logit_bias"),
    ({"temperature": 5}, "temperature"), ({"extra_body": {"bogus": 1}}, "bogus"),
])
def test_bad_parameters_raise_bad_request_naming_them(client: openai.OpenAI, kw: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, **kw)  # type: ignore[call-overload]
    assert info.value.status_code == 400 and info.value.body["type"] == "invalid_request_error"
    assert info.value.body["param"] == param


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=HI, max_tokens=4)
    assert info.value.body["code"] == "model_not_found"


def test_context_overflow_is_a_bad_request_and_leaves_the_kv_clean(client: openai.OpenAI,
                                                                  api_server: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="word " * 5000, max_tokens=4)
    assert "context limit" in info.value.message
    assert_kv_clean(api_server)
