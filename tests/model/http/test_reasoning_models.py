"""Reasoning kept apart from the answer, for real: tiny GGUFs of reasoning families (the tiny vocabulary with the
family's tokens, its real chat template, seeded random weights: built here, never committed) served through the
official SDKs. The output is forced (a thinking budget with the end marker's logit lowered, so the thought runs to
the budget; a JSON Schema for the answer), so the thought must come back as ``reasoning_content`` and the answer as
``content``, streamed and unstreamed alike; the thought is closed at exactly the budget (counted in tokens); the
schema applies to the answer after the thought; a budget of 0 turns thinking off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from inference_client import InferenceClient
from inference_client.cli import main as cli_main
from inference_client.events import Delta, Done

from tests.support.family_models import family_server, openai_client
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model
QWEN = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
THINK = ["<think>", "</think>"]
USER_TOKENS = [*THINK, "<tool_call>", "</tool_call>"]
# template -> (control tokens, bos, eos, template variables, the prompt opens the thought)
CASES: dict[str, tuple[list[str], str, str, dict[str, Any], bool]] = {
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": (DEEPSEEK, DEEPSEEK[0], DEEPSEEK[1], {"enable_thinking": True},
                                                 True),
    "Qwen-Qwen3-0.6B": (QWEN, QWEN[0], QWEN[2], {}, False),
    # NOTE: DSML calls after the thought (｜DSML｜ one special token, as in DeepSeek V3.2's vocabulary)
    "deepseek-ai-DeepSeek-V3.2": ([*DEEPSEEK, "｜DSML｜"], DEEPSEEK[0], DEEPSEEK[1], {"enable_thinking": True}, True),
}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean", "const": True}}, "required": ["ok"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
ASK = [{"role": "user", "content": "Is 2 less than 3?"}]
BUDGET = 6


@pytest.fixture(scope="module", params=sorted(CASES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    name = request.param
    control, bos, eos, _vars, _opens = CASES[name]
    path = tmp_path_factory.mktemp("reasoning") / f"{name}.gguf"
    with family_server(path, name, control, bos, eos, USER_TOKENS, 11) as srv:
        yield name, srv


def think_ids(name: str) -> tuple[int, int]:
    """The ids of <think> and </think>: the user-defined tokens follow the control tokens (tiny_vocab.build)."""
    n = len(CASES[name][0])
    return n, n + 1


def forced(name: str, **extra: Any) -> dict[str, Any]:
    """A request whose thought runs to the budget (the end marker's logit lowered; a template that leaves the
    opening to the model has <think> raised) and whose answer is the schema's one document."""
    open_id, close_id = think_ids(name)
    bias = {str(close_id): -100, **({} if CASES[name][4] else {str(open_id): 100})}
    body = {"chat_template_kwargs": CASES[name][3], "thinking_budget_tokens": BUDGET, **extra.pop("extra_body", {})}
    return {"messages": ASK, "max_tokens": 48, "temperature": 0, "logit_bias": bias, "response_format": FORMAT,
            "extra_body": body, **extra}


client = openai_client


def test_the_models_reasoning_is_reported(served: tuple[str, Any]) -> None:
    _name, srv = served
    c, model = client(srv)
    fmt = (c.models.retrieve(model).model_extra or {})["chat_format"]
    assert fmt["reasoning"] == {"markers": "think", "open": "<think>", "close": "</think>"}


def test_the_thought_is_reasoning_content_and_the_answer_content_streamed_and_not(served: tuple[str, Any]) -> None:
    name, srv = served
    c, model = client(srv)
    whole = c.chat.completions.create(model=model, **forced(name))
    msg = whole.choices[0].message
    thought = (msg.model_extra or {}).get("reasoning_content")
    assert whole.choices[0].finish_reason == "stop", whole
    assert json.loads(msg.content or "") == {"ok": True}
    assert thought and "<think>" not in thought and "</think>" not in thought
    usage = whole.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == BUDGET + (1 if CASES[name][4] else 2)
    chunks = list(c.chat.completions.create(model=model, stream=True, **forced(name)))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == msg.content
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert not any((d.model_extra or {}).get("reasoning_content") for d in deltas[first_answer:])
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert_kv_clean(srv)


def test_the_thought_is_closed_at_the_budget_counted_in_tokens(served: tuple[str, Any]) -> None:
    name, srv = served
    c, model = client(srv)
    reply = c.chat.completions.create(model=model, logprobs=True, **forced(name))
    tokens = [e.token for e in (reply.choices[0].logprobs and reply.choices[0].logprobs.content) or []]
    opened = 0 if CASES[name][4] else 1  # the model's own <think> first, where the prompt leaves it open
    assert tokens[:opened] == ["<think>"] * opened
    assert tokens.index("</think>") == opened + BUDGET, tokens
    assert "".join(tokens[opened + BUDGET + 1:]).strip() == reply.choices[0].message.content


def test_the_schema_applies_to_the_answer_after_the_thought_not_to_the_thought(served: tuple[str, Any]) -> None:
    name, srv = served
    c, model = client(srv)
    reply = c.chat.completions.create(model=model, **forced(name))
    thought = (reply.choices[0].message.model_extra or {})["reasoning_content"]
    assert not thought.lstrip().startswith("{")  # the thought is free text, not the document
    assert json.loads(reply.choices[0].message.content or "") == {"ok": True}


def test_a_budget_of_zero_turns_thinking_off(served: tuple[str, Any]) -> None:
    name, srv = served
    c, model = client(srv)
    body = forced(name)
    body["extra_body"] = {"thinking_budget_tokens": 0}
    reply = c.chat.completions.create(model=model, **body)
    assert not (reply.choices[0].message.model_extra or {}).get("reasoning_content")
    assert json.loads(reply.choices[0].message.content or "") == {"ok": True}


def claude(srv: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.server.http_port}", api_key="unused", max_retries=0,
                               timeout=600)


# NOTE: the Messages and Responses APIs have no logit_bias to make the model open a thought: the family whose
# prompt opens it
OPENS = pytest.mark.parametrize("served", [next(n for n, case in CASES.items() if case[4])], indirect=True)


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}}}


def test_a_tool_call_after_the_thought_in_the_familys_syntax(served: tuple[str, Any]) -> None:
    name, srv = served
    c, model = client(srv)
    body = forced(name, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=200)
    del body["response_format"]
    whole = c.chat.completions.create(model=model, **body)
    choice = whole.choices[0]
    calls = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and len(calls) == 1, whole
    assert calls[0].function.name == "get_weather" and set(json.loads(calls[0].function.arguments)) == {"city"}
    thought = (choice.message.model_extra or {}).get("reasoning_content")
    assert thought and "</think>" not in thought and "get_weather" not in thought
    chunks = list(c.chat.completions.create(model=model, stream=True, **body))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == thought
    pieces = [tc for d in deltas for tc in d.tool_calls or []]
    assert "".join(p.function.arguments or "" for p in pieces) == calls[0].function.arguments


@OPENS
def test_anthropic_thinking_blocks_streamed_with_the_sdks_helper_and_not(served: tuple[str, Any]) -> None:
    _name, srv = served
    c = claude(srv)
    model = c.models.list().data[0].id
    kw: dict[str, Any] = {"model": model, "max_tokens": 1100, "extra_body": {"temperature": 0}, "messages": ASK,
                          "thinking": {"type": "enabled", "budget_tokens": 1024},
                          "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
    whole = c.messages.create(**kw)
    kinds = [b.type for b in whole.content]
    assert kinds == ["thinking", "text"], whole
    thinking, text = whole.content
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature == ""
    assert "</think>" not in thinking.thinking
    assert text.type == "text" and json.loads(text.text) == {"ok": True}
    with c.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    # NOTE: a thought of 1,024 random-weight tokens meets near-ties, which the prefix cache's reuse of the first
    # run's prompt may tip: the stream is held to its own events and to the unstreamed answer's shape
    assert [b.type for b in final.content] == kinds and final.content[1].model_dump() == text.model_dump()
    streamed = final.content[0]
    assert streamed.type == "thinking" and streamed.signature == "" and streamed.thinking
    assert "".join(e.delta.thinking for e in events if e.type == "content_block_delta"
                   and e.delta.type == "thinking_delta") == streamed.thinking
    assert [e.delta.type for e in events if e.type == "content_block_delta"
            and e.delta.type == "signature_delta"] == ["signature_delta"]
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    off = c.messages.create(**{**kw, "thinking": {"type": "disabled"}})
    assert [b.type for b in off.content] == ["text"] and json.loads(off.content[0].text) == {"ok": True}
    for thinking, reply in ((kw["thinking"], whole), ({"type": "disabled"}, off)):  # the prompt each one prefilled
        counted = c.messages.count_tokens(model=model, messages=ASK, thinking=thinking).input_tokens
        assert counted == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
    assert_kv_clean(srv)


@OPENS
def test_responses_reasoning_item_streamed_through_the_openai_sdk(served: tuple[str, Any]) -> None:
    _name, srv = served
    c, model = client(srv)
    kw: dict[str, Any] = {"model": model, "input": ASK, "max_output_tokens": 48, "temperature": 0,
                          "text": {"format": {"type": "json_schema", "name": "verdict", "schema": SCHEMA}},
                          "reasoning": {"effort": "high"}, "extra_body": {"thinking_budget_tokens": BUDGET}}
    whole = c.responses.create(**kw)
    kinds = [item.type for item in whole.output]
    assert kinds == ["reasoning", "message"], whole
    reasoning = whole.output[0]
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].type == "reasoning_text"
    thought = reasoning.content[0].text
    assert thought and "</think>" not in thought
    assert json.loads(whole.output_text) == {"ok": True}
    assert whole.usage is not None and 0 < whole.usage.output_tokens_details.reasoning_tokens <= BUDGET + 1
    with c.responses.stream(**kw) as s:
        events = list(s)
        final = s.get_final_response()
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert json.loads(final.output_text) == {"ok": True}
    assert events[-1].type == "response.completed"


def test_grpc_generate_keeps_the_thought_in_delta_reasoning_through_the_python_client(served: tuple[str, Any]) -> None:
    name, srv = served
    open_id, close_id = think_ids(name)
    bias = {close_id: -100.0, **({} if CASES[name][4] else {open_id: 100.0})}
    with InferenceClient(f"127.0.0.1:{srv.port}") as c:
        info = c.model_info()
        assert info.chat.reasoning == "think"
        events = list(c.generate(messages=ASK, max_tokens=48, temperature=0, logit_bias=bias,
                                 thinking_budget_tokens=BUDGET, json_schema=SCHEMA))
    deltas = [e for e in events if isinstance(e, Delta)]
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "stop"
    thought = "".join(d.reasoning for d in deltas)
    assert thought and "<think>" not in thought and "</think>" not in thought
    assert json.loads("".join(d.text for d in deltas)) == {"ok": True}
    assert done.usage.reasoning_tokens == BUDGET + (1 if CASES[name][4] else 2)
    http, model = client(srv)
    same = http.chat.completions.create(model=model, **forced(name))
    assert (same.choices[0].message.model_extra or {})["reasoning_content"] == thought


# template -> it renders an earlier turn's thought (Qwen3's after the last user turn; DeepSeek R1's drops it)
# NOTE: DeepSeek V3.2 renders a thought only with thinking on (this render has no template variables)
PASSES_BACK = {"Qwen-Qwen3-0.6B": True, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": False,
               "deepseek-ai-DeepSeek-V3.2": False}


def test_earlier_thoughts_are_passed_back_where_the_template_renders_them(served: tuple[str, Any]) -> None:
    name, srv = served
    _c, model = client(srv)
    history = [*ASK, {"role": "assistant", "content": "", "reasoning_content": "EARLIER THOUGHT",
                      "tool_calls": [{"id": "call_1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "RESULT 12 C"}]
    with httpx2.Client(base_url=f"http://127.0.0.1:{srv.server.http_port}", timeout=600) as http:
        r = http.post("/v1/chat/completions/render", json={"model": model, "tools": [WEATHER], "messages": history})
        assert r.status_code == 200, r.text
        assert ("EARLIER THOUGHT" in r.json()["prompt"]) is PASSES_BACK[name]
        assert "RESULT 12 C" in r.json()["prompt"]
        bad = http.post("/v1/chat/completions", json={"model": model, "messages": [
            {"role": "user", "content": "Hi", "reasoning_content": "not mine"}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages[0].reasoning_content"
    c = claude(srv)
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "RESULT 12 C"}
    tools: list[Any] = [{"name": "get_weather", "description": "Current weather of a city",
                         "input_schema": WEATHER["function"]["parameters"]}]
    turns: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": [call]},
                        {"role": "user", "content": [result]}]
    plain = c.messages.count_tokens(model=model, messages=turns, tools=tools).input_tokens
    turns[1]["content"].insert(0, {"type": "thinking", "thinking": "EARLIER THOUGHT", "signature": ""})
    with_thought = c.messages.count_tokens(model=model, messages=turns, tools=tools).input_tokens
    assert (with_thought > plain) is PASSES_BACK[name], (plain, with_thought)


@OPENS
def test_the_cli_prints_the_answer_on_stdout_and_the_thought_on_stderr(served: tuple[str, Any], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _name, srv = served
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    code = cli_main(["--target", f"127.0.0.1:{srv.port}", "generate", "--chat", "Is 2 less than 3?", "--max-tokens",
                     "48", "--temperature", "0", "--thinking-budget", str(BUDGET), "--json-schema", str(schema)])
    out = capsys.readouterr()
    assert code == 0 and json.loads(out.out) == {"ok": True}
    assert "</think>" not in out.err and "reasoning=" in out.err


def test_the_render_endpoint_renders_the_prompt_a_budget_asks_for(served: tuple[str, Any]) -> None:
    name, srv = served
    _c, model = client(srv)
    with httpx2.Client(base_url=f"http://127.0.0.1:{srv.server.http_port}", timeout=600) as http:
        def prompt(**extra: Any) -> str:
            r = http.post("/v1/chat/completions/render", json={"model": model, "messages": ASK, **extra})
            assert r.status_code == 200, r.text
            return str(r.json()["prompt"])

        on, off = prompt(thinking_budget_tokens=BUDGET), prompt(thinking_budget_tokens=0)
    assert on != off
    assert on.rstrip().endswith("<think>") is CASES[name][4]  # the prompt opens the thought where it can
    assert "</think>" in off[-12:]  # thinking off: the template's empty (or closed) thought
