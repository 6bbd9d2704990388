"""Reasoning kept apart from the answer, without a model: the markers detected in every vendored template that has
them, where each template's generation prompt leaves the output (inside a thought, after an empty one, or free to
open one) with thinking on, off and by default; the reader splitting thought from answer whatever the split of the
text (markers across deltas included); and the grammar of a whole output (the budget closes the thought with the
end marker, counted in tokens; a JSON Schema applies to the answer after the thought), over a tiny vocabulary where
the markers are special tokens and one where they are text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.chat.calls import ToolCall
from service.chat.conversation import Conversation, Turn
from service.chat.markup import bind
from service.chat.thinking import MARKERS, Start, Thinking, detect
from service.chat.thought import ThoughtReader, grammar
from service.model.chat import ChatTemplate
from tests.support.chat_templates import TEMPLATES, chat_template
from tests.support.grammar_vocab import GrammarVocab
from tests.support.tiny_vocab import CHAT_TEMPLATE, CONTROL
from tests.support.tiny_vocab import Family as VocabFamily

# template -> (markers, start by default, with enable_thinking true, with enable_thinking false)
EXPECTED: dict[str, tuple[str, str, str, str]] = {
    "Bielik-11B-v3.0-Instruct": ("think", "maybe", "inside", "maybe"),
    "ByteDance-Seed-OSS": ("seed-oss", "maybe", "maybe", "maybe"),
    "GLM-4.6": ("think", "maybe", "maybe", "closed"),
    "GLM-4.7-Flash": ("think", "inside", "inside", "closed"),
    "HuggingFaceTB-SmolLM3-3B": ("think", "maybe", "maybe", "closed"),
    "Kimi-K2-Thinking": ("think", "maybe", "maybe", "maybe"),
    "LFM2.5-8B-A1B": ("think", "maybe", "maybe", "maybe"),
    "MiniMax-M2": ("think", "inside", "inside", "inside"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("think", "inside", "inside", "closed"),
    "NVIDIA-Nemotron-Nano-v2": ("think", "inside", "inside", "inside"),
    "Qwen-QwQ-32B": ("think", "closed", "inside", "closed"),
    "Qwen-Qwen3-0.6B": ("think", "maybe", "maybe", "closed"),
    "Qwen3.5-4B": ("think", "inside", "inside", "closed"),
    "Reka-Edge": ("think", "maybe", "inside", "maybe"),
    "Spark2.5": ("think", "inside", "inside", "closed"),
    "StepFun3.5-Flash": ("think", "inside", "inside", "inside"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("think", "inside", "inside", "inside"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("think", "closed", "inside", "closed"),
    "deepseek-ai-DeepSeek-V3.1": ("think", "closed", "inside", "closed"),
    "deepseek-ai-DeepSeek-V3.2": ("think", "closed", "inside", "closed"),
    "deepseek-ai-DeepSeek-V4-Flash-0731": ("think", "closed", "inside", "closed"),
    "deepseek-ai-DeepSeek-V4": ("think", "closed", "inside", "closed"),
    "ibm-granite-granite-3.3-2B-Instruct": ("think", "maybe", "maybe", "maybe"),
    "inclusionai-ling-3.0-flash": ("think", "inside", "inside", "closed"),
    "llama-cpp-deepseek-r1": ("think", "inside", "inside", "inside"),
    "llama-cpp-rwkv-world": ("think", "maybe", "inside", "closed"),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral-think", "maybe", "maybe", "maybe"),
    "openai-gpt-oss-120b": ("harmony", "maybe", "maybe", "maybe"),
    "openbmb-MiniCPM5-1B": ("think", "maybe", "inside", "closed"),
    "poolside-Laguna-S-2.1": ("think", "inside", "inside", "closed"),
    "poolside-Laguna-XS-2.1": ("think", "closed", "inside", "closed"),
    "poolside-Laguna-XS.2": ("think", "closed", "inside", "closed"),
}
THINK = next(m for m in MARKERS if m.name == "think")
SCHEMA = {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"], "additionalProperties": False}
ANSWER = f"start: %json {json.dumps(SCHEMA)}\n"


@pytest.mark.parametrize("name", sorted(p.stem for p in TEMPLATES.glob("*.jinja")))
def test_the_reasoning_markers_and_where_the_prompt_leaves_generation(name: str) -> None:
    template = ChatTemplate(chat_template(name), "<s>", "</s>")
    if name not in EXPECTED:
        assert template.thinking is None, name
        return
    markers, default, on, off = EXPECTED[name]
    assert template.thinking is not None and template.thinking.name == markers
    starts = [template.thought_start(v) for v in ({}, {"enable_thinking": True}, {"enable_thinking": False})]
    assert [s.value for s in starts if s is not None] == [default, on, off]


def test_the_prompts_that_open_the_thought_and_those_that_close_it() -> None:
    r1 = ChatTemplate(chat_template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B"), "<s>", "</s>")
    assert r1.render([("user", "Hi")]).endswith("<think>\n") and r1.thought_start({}) is Start.INSIDE
    qwen3 = ChatTemplate(chat_template("Qwen-Qwen3-0.6B"), "<s>", "</s>")
    assert qwen3.thought_start({"enable_thinking": False}) is Start.CLOSED
    assert THINK.start("<|im_start|>assistant\n<think>\n\n</think>\n\n") is Start.CLOSED
    assert THINK.start("<|im_start|>assistant\n") is Start.MAYBE


def test_templates_without_markers_are_not_reasoning_rows() -> None:
    assert detect(chat_template("Qwen-Qwen2.5-7B-Instruct")) is None
    assert detect(None) is None


def read(thinking: Thinking, start: Start, text: str, step: int) -> tuple[list[str], list[str], str, str]:
    r = ThoughtReader(thinking, start)
    thoughts, answers = [], []
    for i in range(0, len(text), step):
        t, a = r.feed(text[i:i + step])
        thoughts.append(t)
        answers.append(a)
    t, a = r.close()
    thoughts.append(t)
    answers.append(a)
    return thoughts, answers, r.thought, r.answer


CASES = [  # (markers, start, output, thought, answer)
    (THINK, Start.MAYBE, "<think>\nLet me see: 2 < 3.\n</think>\n\nYes, 2 is less.", "Let me see: 2 < 3.\n",
     "Yes, 2 is less."),
    (THINK, Start.MAYBE, "\n<think>x</think>y", "x", "y"),
    (THINK, Start.MAYBE, "No thought here: <think> is text.", "", "No thought here: <think> is text."),
    (THINK, Start.MAYBE, "<thin", "", "<thin"),
    (THINK, Start.INSIDE, "The user greets. </thin</think>\n\nHello ✓ 😀!", "The user greets. </thin",
     "Hello ✓ 😀!"),
    (THINK, Start.INSIDE, "Still thinking when cut off </thi", "Still thinking when cut off </thi", ""),
    (THINK, Start.CLOSED, "<think>an answer that writes the marker</think>", "",
     "<think>an answer that writes the marker</think>"),
    (next(m for m in MARKERS if m.name == "mistral-think"), Start.MAYBE, "[THINK]plan[/THINK]Answer.", "plan",
     "Answer."),
    (next(m for m in MARKERS if m.name == "seed-oss"), Start.MAYBE,
     "<seed:think>a</think> b</seed:think>\nc", "a</think> b", "c"),
]


@pytest.mark.parametrize(("thinking", "start", "text", "thought", "answer"), CASES)
def test_thought_and_answer_in_every_split_of_the_output(thinking: Thinking, start: Start, text: str, thought: str,
                                                         answer: str) -> None:
    for step in range(1, len(text) + 1):
        pieces_t, pieces_a, whole_t, whole_a = read(thinking, start, text, step)
        assert (whole_t, whole_a) == (thought, answer), step
        assert ("".join(pieces_t), "".join(pieces_a)) == (thought, answer), step
        assert not any(thinking.close in p or thinking.open in p for p in pieces_t), step


def test_no_piece_shows_part_of_a_marker_split_across_deltas() -> None:
    r = ThoughtReader(THINK, Start.INSIDE)
    assert r.feed("abc<") == ("abc", "")
    assert r.feed("/thi") == ("", "")
    assert r.thinking_now
    assert r.feed("nk>\n") == ("", "")
    assert not r.thinking_now
    assert r.feed("ok") == ("", "ok")


class Tiny(GrammarVocab):
    """A tiny vocabulary whose <think> markers are special tokens (``special``) or text, and its llguidance
    tokenizer."""

    def __init__(self, special: bool, path: Path) -> None:
        control = [*CONTROL, "<think>", "</think>"] if special else CONTROL
        family = VocabFamily("think-tiny", control, "<|endoftext|>", "<|im_end|>", CHAT_TEMPLATE)
        super().__init__(family, path, [THINK.open, THINK.close])


@pytest.fixture(scope="module", params=[True, False], ids=["special", "text"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return Tiny(request.param, tmp_path_factory.mktemp("think") / "vocab.gguf")


def test_the_schema_applies_to_the_answer_after_the_thought(tiny: Tiny) -> None:
    source = grammar(THINK, tiny.markup, Start.INSIDE, None, ANSWER)
    good = tiny.ids('The brain {"a": 2} thinks.</think>{"a": 1}')
    m = tiny.matcher(source)
    assert m.validate_tokens(good) == len(good) and m.consume_tokens(good) and m.is_accepting()
    bad = tiny.ids('The brain thinks.</think>{"a": 2}')
    assert tiny.matcher(source).validate_tokens(bad) < len(bad)
    maybe = grammar(THINK, tiny.markup, Start.MAYBE, None, ANSWER)
    for text in ('{"a": 1}', '<think>hmm</think>{"a": 1}'):
        ids = tiny.ids(text)
        m = tiny.matcher(maybe)
        assert m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting(), text


def test_the_budget_closes_the_thought_with_the_end_marker_after_that_many_tokens(tiny: Tiny) -> None:
    budget = 5
    m = tiny.matcher(grammar(THINK, tiny.markup, Start.INSIDE, budget, ANSWER))
    thought = tiny.ids("Once upon a time there was a small town by the sea")
    assert len(thought) > budget
    assert m.consume_tokens(thought[:budget])
    assert not m.validate_tokens(thought[budget:budget + 1])  # the thought may not go on
    close = tiny.ids("</think>")
    assert m.validate_tokens(close) == len(close)
    assert m.consume_tokens(close) and m.consume_tokens(tiny.ids('{"a": 1}')) and m.is_accepting()


def test_within_the_budget_the_model_ends_its_thought_itself(tiny: Tiny) -> None:
    ids = tiny.ids('Short.</think>{"a": 1}')
    m = tiny.matcher(grammar(THINK, tiny.markup, Start.INSIDE, 64, ANSWER))
    assert m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()


def test_a_closed_start_leaves_the_answers_grammar_alone() -> None:
    assert grammar(THINK, bind([], lambda t: [], lambda t: False, str), Start.CLOSED, 5, ANSWER) == ANSWER


def test_an_earlier_thought_is_the_templates_reasoning_content_rendered_or_dropped_by_it() -> None:
    conv = Conversation([Turn("user", "Weather?"), Turn("assistant", "", (ToolCall("w", '{"c": 1}', "c1"),),
                                                          reasoning="EARLIER <|im_end|> THOUGHT"),
                         Turn("tool", "12 C", call_id="c1", name="w")])
    qwen3 = ChatTemplate(chat_template("Qwen-Qwen3-0.6B"), "<s>", "</s>")
    assert "<think>\nEARLIER <|im_end|> THOUGHT\n</think>" in qwen3.render(conv)
    assert "EARLIER" not in qwen3.render(conv, lambda s: s.replace("EARLIER", "escaped"))
    r1 = ChatTemplate(chat_template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B"), "<s>", "</s>")
    assert "EARLIER" not in r1.render(conv)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_reasoning_templates_output_reads_back_from_where_its_prompt_leaves_it(name: str) -> None:
    template = ChatTemplate(chat_template(name), "<s>", "</s>")
    t = template.thinking
    assert t is not None
    for variables in ({"enable_thinking": True}, {"enable_thinking": False}):
        start = template.thought_start(variables)
        assert start is not None
        thought, answer = "Step 1: 2 < 3 ✓, so yes", "Yes: 2 < 3."
        output = {Start.INSIDE: f"\n{thought}\n{t.close}\n\n{answer}",
                  Start.MAYBE: f"{t.open}\n{thought}{t.close}{answer}", Start.CLOSED: answer}[start]
        want = ("", answer) if start is Start.CLOSED else (thought + ("\n" if start is Start.INSIDE else ""), answer)
        for step in (1, 2, 3, 5, len(output)):
            _, _, got_thought, got_answer = read(t, start, output, step)
            assert (got_thought, got_answer) == want, (name, variables, step)


def test_a_callers_grammar_with_rules_named_like_ours_composes(tiny: Tiny) -> None:
    own = 'start: answer thought\nanswer: "yes" | "no"\nthought: " because " WORD\nWORD: /[a-z]+/\n'
    m = tiny.matcher(grammar(THINK, tiny.markup, Start.INSIDE, 32, own))
    ids = tiny.ids("hmm</think>yes because brain")
    assert m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()
