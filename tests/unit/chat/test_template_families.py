"""Every real chat template (llama.cpp's 70, from the pinned sdist: ``make templates``): the family detected is
the expected one, and a whole tool conversation renders (system turn, tools, an assistant turn of two calls, two
results, the assistant's answer, a follow-up) with every tool name and every result in it, whatever the template
can render itself. Where a family's template renders earlier calls, it writes them exactly in the family's syntax
(the syntax the grammar makes the model write)."""

from __future__ import annotations

import pytest

from service.chat.calls import Function, ToolCall
from service.chat.conversation import Conversation, Turn
from service.model.chat import ChatTemplate
from tests.support.chat_templates import TEMPLATES, chat_template

# The family each template's model writes its calls in ("generic": none this server knows; the server then
# describes the tools itself and the model calls in the <tool_call> JSON syntax).
EXPECTED = {
    "Apertus-8B-Instruct": "generic",
    "Apriel-1.6-15b-Thinker-fixed": "apriel",
    "Bielik-11B-v3.0-Instruct": "hermes",
    "ByteDance-Seed-OSS": "seed-oss",
    "Cohere2MoE": "command-r7b",
    "CohereForAI-c4ai-command-r-plus-tool_use": "generic",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command-r7b",
    "GLM-4.6": "glm-4.5",
    "GLM-4.7-Flash": "glm-4.7",
    "GigaChat3-10B-A1.8B": "generic",
    "GigaChat3.1-10B-A1.8B": "generic",
    "HuggingFaceTB-SmolLM3-3B": "smollm3",
    "Kimi-K2-Instruct": "kimi-k2",
    "Kimi-K2-Thinking": "kimi-k2",
    "Kimi-K3": "generic",
    "LFM2-8B-A1B": "generic",
    "LFM2.5-8B-A1B": "generic",
    "LFM2.5-Instruct": "generic",
    "MiMo-VL": "hermes",
    "MiniMax-M1": "minimax-m1",
    "MiniMax-M2": "minimax-m2",
    "MiniMax-M3": "generic",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral-v11-ids",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen3-coder",
    "NVIDIA-Nemotron-Nano-v2": "nemotron-v2",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "Qwen-QwQ-32B": "hermes",
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "Qwen3-Coder": "qwen3-coder",
    "Qwen3.5-4B": "qwen3-coder",
    "Reka-Edge": "hermes",
    "Spark2.5": "glm-4.7",
    "StepFun3.5-Flash": "qwen3-coder",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "deepseek-r1",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek-r1",
    "deepseek-ai-DeepSeek-V3.1": "deepseek-v3.1",
    "deepseek-ai-DeepSeek-V3.2": "deepseek-v3.2",
    "deepseek-ai-DeepSeek-V4-Flash-0731": "deepseek-v4",
    "deepseek-ai-DeepSeek-V4": "deepseek-v4",
    "fireworks-ai-llama-3-firefunction-v2": "firefunction-v2",
    "google-gemma-2-2b-it": "generic",
    "google-gemma-4-31B-it-interleaved": "generic",
    "google-gemma-4-31B-it": "generic",
    "ibm-granite-granite-3.3-2B-Instruct": "granite-3",
    "ibm-granite-granite-4.0": "hermes",
    "ibm-granite-granite-4.1": "hermes",
    "inclusionai-ling-3.0-flash": "glm-4.5",
    "llama-cpp-deepseek-r1": "deepseek-r1",
    "llama-cpp-rwkv-world": "generic",
    "meetkai-functionary-medium-v3.1": "functionary-v3.1",
    "meetkai-functionary-medium-v3.2": "functionary-v3.2",
    "meta-llama-Llama-3.1-8B-Instruct": "llama-3",
    "meta-llama-Llama-3.2-3B-Instruct": "llama-3",
    "meta-llama-Llama-3.3-70B-Instruct": "llama-3",
    "microsoft-Phi-3.5-mini-instruct": "generic",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral-v11",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral-nemo",
    "moonshotai-Kimi-K2": "kimi-k2",
    "muse-glimmer": "generic",
    "openai-gpt-oss-120b": "gpt-oss",
    "openbmb-MiniCPM5-1B": "generic",
    "poolside-Laguna-S-2.1": "glm-4.7",
    "poolside-Laguna-XS-2.1": "glm-4.5",
    "poolside-Laguna-XS.2": "glm-4.5",
    "tencent-Hy3": "generic",
    "unsloth-Apriel-1.5": "apriel",
    "unsloth-mistral-Devstral-Small-2507": "mistral-v11",
    "upstage-Solar-Open-100B": "generic",
}
WEATHER = Function("get_weather", {"type": "object", "properties": {"city": {"type": "string"}, "days": {
    "type": "integer"}}, "required": ["city"]}, "Weather of a city")
TIME = Function("get_time", {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
                "Time in a zone")
CALLS = (ToolCall("get_weather", '{"city": "Paris", "days": 2}', "call_8f3a1c2b9d"),
         ToolCall("get_time", '{"zone": "CET"}', "call_27e5b4f0aa"))
CONVERSATION = Conversation([
    Turn("system", "You are terse."),
    Turn("user", "Weather and time in Paris?"),
    Turn("assistant", "", CALLS),
    Turn("tool", "RESULT_WEATHER_sunny", call_id=CALLS[0].id, name="get_weather"),
    Turn("tool", "RESULT_TIME_noon", call_id=CALLS[1].id, name="get_time"),
    Turn("assistant", "Sunny, and it is noon."),
    Turn("user", "And tomorrow?"),
], [WEATHER, TIME])


def _names() -> list[str]:
    return sorted(p.stem for p in TEMPLATES.glob("*.jinja"))


@pytest.fixture(scope="module", params=_names())
def template(request: pytest.FixtureRequest) -> tuple[str, ChatTemplate]:
    return request.param, ChatTemplate(chat_template(request.param), "<s>", "</s>")


def test_every_template_has_an_expected_family() -> None:
    assert len(_names()) >= 70 and set(_names()) == set(EXPECTED)


def test_the_detected_family_is_the_expected_one(template: tuple[str, ChatTemplate]) -> None:
    name, tmpl = template
    assert tmpl.family.name == EXPECTED[name]


def test_a_whole_tool_conversation_renders_with_every_tool_and_result(template: tuple[str, ChatTemplate]) -> None:
    _name, tmpl = template
    out = tmpl.render(CONVERSATION)
    for needle in ("get_weather", "get_time", "RESULT_WEATHER_sunny", "RESULT_TIME_noon", "Paris", "CET",
                   "You are terse.", "Weather and time in Paris?", "Sunny, and it is noon.", "And tomorrow?"):
        assert needle in out, needle


def test_calls_the_template_renders_are_in_the_familys_syntax(template: tuple[str, ChatTemplate]) -> None:
    _name, tmpl = template
    if not tmpl.caps.calls:
        return  # the server writes the calls itself, in the family's syntax
    syntax = tmpl.family.syntax
    one = Conversation([Turn("user", "Time?"), Turn("assistant", "", CALLS[1:]),
                        Turn("tool", "noon", call_id=CALLS[1].id, name="get_time"), Turn("assistant", "Noon."),
                        Turn("user", "Thanks.")], [WEATHER, TIME])
    ids = {CALLS[1].id: tmpl.family.call_id(CALLS[1].id, 0)}
    call = ToolCall(CALLS[1].name, CALLS[1].arguments, ids[CALLS[1].id])
    assert syntax.render([call]) in tmpl.render(one)


def test_a_template_of_a_known_family_renders_the_tools_itself_where_it_can() -> None:
    """The server's system-turn description is the fallback: only templates that render no tools (or whose
    family is unknown) get it."""
    native = {n for n in EXPECTED if ChatTemplate(chat_template(n)).tools_path == "template"}
    assert {"Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407",
            "Qwen3-Coder", "moonshotai-Kimi-K2", "CohereForAI-c4ai-command-r7b-12-2024-tool_use"} <= native
    assert not native & {n for n, f in EXPECTED.items() if f == "generic"}
    assert "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B" not in native  # its template renders no tools
