"""Small GGUFs of other model families (a tiny vocabulary with the family's special tokens and its real chat
template, seeded random weights: built here, never committed) served for real, through the OpenAI SDK: the family is
detected as expected, a forced call is generated in the family's own syntax (its markers special tokens of the
vocabulary) and comes back as exactly one valid call, streamed pieces concatenate to the unstreamed answer, and a
round trip renders the call in the family's syntax and the result through the model's own template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from service.chat.calls import ToolCall
from service.chat.families import FAMILIES
from tests.support.family_models import family_server, openai_client
from tests.support.server import assert_kv_clean

pytestmark = pytest.mark.model
QWEN = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>"]
MISTRAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
           "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[ARGS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
            "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]
KIMI = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
        "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>"]
DSML = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "｜DSML｜"]
# template -> (expected family, control tokens, bos, eos, user-defined tokens, tools rendered by the template)
CASES: dict[str, tuple[str, list[str], str, str, list[str], str]] = {
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", QWEN, "<|endoftext|>", "<|im_end|>", ["<tool_call>", "</tool_call>"],
                                 "template"),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama-3", LLAMA, "<|begin_of_text|>", "<|eot_id|>", [], "template"),
    "unsloth-mistral-Devstral-Small-2507": ("mistral-v11", MISTRAL, "<s>", "</s>", [], "template"),
    "Qwen3-Coder": ("qwen3-coder", QWEN, "<|endoftext|>", "<|im_end|>", ["<tool_call>", "</tool_call>"], "template"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("deepseek-r1", DEEPSEEK, "<｜begin▁of▁sentence｜>",
                                                 "<｜end▁of▁sentence｜>", ["<think>", "</think>"], "system_turn"),
    "moonshotai-Kimi-K2": ("kimi-k2", KIMI, "[BOS]", "[EOS]", [], "template"),
    "meetkai-functionary-medium-v3.2": ("functionary-v3.2", LLAMA, "<|begin_of_text|>", "<|eot_id|>", [], "template"),
    # NOTE: ｜DSML｜ is one special token of DeepSeek V3.2's vocabulary (llama.cpp preserves it as one)
    "deepseek-ai-DeepSeek-V3.2": ("deepseek-v3.2", DSML, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                  ["<think>", "</think>"], "template"),
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module", params=sorted(CASES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    name = request.param
    _family, control, bos, eos, user, _tools = CASES[name]
    with family_server(tmp_path_factory.mktemp("families") / f"{name}.gguf", name, control, bos, eos, user, 7) as srv:
        yield name, srv


clients = openai_client


def test_the_family_is_detected_and_reported(served: tuple[str, Any]) -> None:
    name, srv = served
    client, model = clients(srv)
    fmt = (client.models.retrieve(model).model_extra or {})["chat_format"]
    assert (fmt["family"], fmt["tools"]) == (CASES[name][0], CASES[name][5])


def test_a_forced_call_in_the_familys_syntax_streamed_and_not(served: tuple[str, Any]) -> None:
    _name, srv = served
    client, model = clients(srv)
    kw: dict[str, Any] = {"model": model, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 200,
                          "temperature": 0, "parallel_tool_calls": False, "messages": ASK}
    whole = client.chat.completions.create(**kw)
    calls = whole.choices[0].message.tool_calls or []
    assert whole.choices[0].finish_reason == "tool_calls" and len(calls) == 1, whole
    assert calls[0].function.name == "get_weather" and set(json.loads(calls[0].function.arguments)) == {"city"}
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function.name == "get_weather" and all(d.index == 0 for d in deltas)
    assert "".join(d.function.arguments or "" for d in deltas) == calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert_kv_clean(srv)


def test_a_round_trip_renders_the_call_and_the_result_in_the_models_template(served: tuple[str, Any]) -> None:
    name, srv = served
    client, model = clients(srv)
    first = client.chat.completions.create(model=model, tools=[WEATHER], tool_choice="required", max_tokens=200,
                                           temperature=0, parallel_tool_calls=False, messages=ASK)
    call = (first.choices[0].message.tool_calls or [])[0]
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "RESULT 12 C"}]
    with httpx2.Client(base_url=f"http://127.0.0.1:{srv.server.http_port}", timeout=600) as http:
        r = http.post("/v1/chat/completions/render", json={"model": model, "tools": [WEATHER], "messages": history})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    family = next(f for f in FAMILIES if f.name == CASES[name][0])
    written = family.syntax.render([ToolCall(call.function.name, call.function.arguments,
                                             family.call_id(call.id, 0))])
    assert written in prompt and "RESULT 12 C" in prompt and "Current weather of a city" in prompt
