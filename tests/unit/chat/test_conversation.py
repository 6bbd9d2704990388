"""What a template cannot render, the server writes: a turn of several calls as one turn per call with its result
(Llama 3.x), Mistral's 9-character call ids, the tools in the system turn in the family's own syntax, earlier calls
in the assistant's text and results as user turns (a template with no tool support), the system text in the first
user turn (no system role). Every caller string passes through the escape; the server's words do not."""

from __future__ import annotations

from service.chat.calls import Function, ToolCall
from service.chat.conversation import Caps, Conversation, Turn, template_input
from service.chat.families import FAMILIES, GENERIC, Family, mistral_id
from service.model.chat import ChatTemplate
from tests.support.chat_templates import chat_template

ADD = Function("add", {"type": "object", "properties": {"a": {"type": "integer"}}}, "adds")
C1, C2 = ToolCall("add", '{"a": 1}', "call_one"), ToolCall("add", '{"a": 2}', "call_two")
FAMILY = {f.name: f for f in FAMILIES}


def conv(*turns: Turn, tools: tuple[Function, ...] = (ADD,)) -> Conversation:
    return Conversation(list(turns), list(tools))


def test_llama_gets_one_call_per_turn_each_followed_by_its_result() -> None:
    tmpl = ChatTemplate(chat_template("meta-llama-Llama-3.1-8B-Instruct"))
    assert tmpl.caps.calls and not tmpl.caps.multi_calls
    c = conv(Turn("user", "1+2?"), Turn("assistant", "", (C1, C2)),
             Turn("tool", "TWO", call_id="call_two"), Turn("tool", "ONE", call_id="call_one"))
    messages = template_input(c, tmpl.family, tmpl.caps, str).messages
    assert [(m["role"], m.get("content")) for m in messages] == [
        ("user", "1+2?"), ("assistant", ""), ("tool", "ONE"), ("assistant", ""), ("tool", "TWO")]
    assert [m["tool_calls"][0]["function"]["arguments"] for m in messages if m["role"] == "assistant"] == [
        {"a": 1}, {"a": 2}]  # arguments as objects: the template writes them with tojson
    out = tmpl.render(c)
    assert out.index('"a": 1') < out.index("ONE") < out.index('"a": 2') < out.index("TWO")


def test_mistral_ids_are_nine_characters_the_same_for_a_call_and_its_result() -> None:
    tmpl = ChatTemplate(chat_template("mistralai-Mistral-Nemo-Instruct-2407"))
    out = tmpl.render(conv(Turn("user", "1?"), Turn("assistant", "", (C1,)), Turn("tool", "ONE", call_id="call_one"),
                           Turn("assistant", "1"), Turn("user", "ok")))
    short = mistral_id("call_one", 0)
    assert len(short) == 9 and short.isalnum() and out.count(f'"{short}"') == 2
    assert mistral_id("abcdefghi", 3) == "abcdefghi"


def test_a_template_without_tool_support_gets_the_servers_words_in_the_familys_syntax() -> None:
    family = FAMILY["deepseek-r1"]
    c = conv(Turn("system", "Be brief."), Turn("user", "1+2?"), Turn("assistant", "Let me add.", (C1, C2)),
             Turn("tool", "ONE", call_id="call_one"), Turn("tool", "TWO", call_id="call_two"))
    inp = template_input(c, family, Caps(), lambda s: s.upper())
    system, user, assistant, results = inp.messages
    assert user == {"role": "user", "content": "1+2?"}
    assert system["role"] == "system" and system["content"].startswith("BE BRIEF.\n\nYou can call these functions")
    assert '"name": "ADD"' in system["content"] and "<｜tool▁calls▁begin｜>" in system["content"]  # the family's
    assert assistant["content"] == "LET ME ADD.\n" + family.syntax.render((C1, C2), str.upper)
    assert "<｜tool▁call▁begin｜>function<｜tool▁sep｜>ADD" in assistant["content"]  # markers are not escaped
    assert results == {"role": "user", "content": "<tool_response>\nONE\n</tool_response>\n"
                                                  "<tool_response>\nTWO\n</tool_response>"}
    assert inp.tools is None


def test_a_template_without_a_system_role_starts_the_first_user_turn_with_it() -> None:
    tmpl = ChatTemplate(chat_template("google-gemma-2-2b-it"))
    assert not tmpl.caps.system and tmpl.family is GENERIC
    out = tmpl.render(conv(Turn("system", "Be brief."), Turn("user", "1+2?")))
    assert "Be brief.\n\nYou can call these functions" in out and out.index("Be brief.") < out.index("1+2?")


def test_template_variables_reach_the_template() -> None:
    tmpl = ChatTemplate(chat_template("Qwen-Qwen3-0.6B"))
    off = tmpl.render(Conversation([Turn("user", "hi")], variables={"enable_thinking": False}))
    on = tmpl.render(Conversation([Turn("user", "hi")]))
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")


def test_a_family_with_template_variables_of_its_own_gets_them() -> None:
    tmpl = ChatTemplate(chat_template("fireworks-ai-llama-3-firefunction-v2"))
    out = tmpl.render(conv(Turn("user", "1+2?")))
    assert '"name": "add"' in out and "Today is" in out and tmpl.family.name == "firefunction-v2"


def test_every_family_has_a_unique_name_and_markers() -> None:
    names = [f.name for f in FAMILIES]
    assert len(set(names)) == len(names) and GENERIC.name not in names
    assert all(isinstance(f, Family) and f.markers for f in FAMILIES)
