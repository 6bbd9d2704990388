"""gpt-oss's harmony without a model: the analysis channel read as the thought and the final channel's header dropped
from the answer in every split of the output; a call read back in both orders of its header (the template's and the
one the models also write), fed whole or in pieces; and the grammar of a whole output over a tiny vocabulary with
harmony's special tokens (which llama.cpp shows as text and ends generation at ``<|call|>`` and ``<|return|>``): the
thought then the call, the budget forcing ``<|end|><|start|>assistant`` and then the final channel's header."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.chat.calls import Function, ToolCall, fold
from service.chat.families import FAMILIES
from service.chat.thinking import MARKERS, Start
from service.chat.thought import ThoughtReader, grammar
from service.model.chat import ChatTemplate
from tests.support.chat_templates import chat_template
from tests.support.grammar_vocab import GrammarVocab
from tests.support.tiny_vocab import Family as VocabFamily

HARMONY = next(m for m in MARKERS if m.name == "harmony")
GPT_OSS = next(f for f in FAMILIES if f.name == "gpt-oss")
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
            "<|constrain|>", "<|return|>", "<|call|>"]
WEATHER = Function("get_weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]})
ARGS = '{"city": "Oslo <b>"}'
ROLE_ORDER = f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}"
CHANNEL_ORDER = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}"


def read(start: Start, text: str, step: int) -> tuple[str, str, str, str]:
    """(joined thought pieces, joined answer pieces, whole thought, whole answer) of ``text`` fed ``step`` at once."""
    r = ThoughtReader(HARMONY, start)
    thought, answer = "", ""
    for i in range(0, len(text), step):
        t, a = r.feed(text[i:i + step])
        thought, answer = thought + t, answer + a
    t, a = r.close()
    return thought + t, answer + a, r.thought, r.answer


CASES = [  # (output after <|start|>assistant, thought, answer as the call parser reads it)
    ("<|channel|>analysis<|message|>2 < 3, so yes.<|end|><|start|>assistant<|channel|>final<|message|>Yes ✓.",
     "2 < 3, so yes.", "Yes ✓."),
    ("<|channel|>final<|message|>No thought.", "", "No thought."),
    ("<|channel|>final<|message|>Done.<|end|><|start|>user<|message|>more", "", "Done."),
    (f"<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant{ROLE_ORDER}", "Call it.", ROLE_ORDER),
    (f"<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant{CHANNEL_ORDER}", "Call it.", CHANNEL_ORDER),
    (ROLE_ORDER, "", ROLE_ORDER),
    ("<|channel|>analysis<|message|>cut off <|en", "cut off <|en", ""),
]


@pytest.mark.parametrize(("text", "thought", "answer"), CASES)
def test_the_analysis_channel_is_the_thought_and_the_final_header_is_dropped_in_every_split(
        text: str, thought: str, answer: str) -> None:
    start = ChatTemplate(chat_template("openai-gpt-oss-120b"), "", "").thought_start({"reasoning_effort": "low"})
    assert start is Start.MAYBE
    for step in range(1, len(text) + 1):
        assert read(Start.MAYBE, text, step) == (thought, answer, thought, answer), step


@pytest.mark.parametrize("answer", [ROLE_ORDER, CHANNEL_ORDER, ROLE_ORDER + "<|call|>",
                                    CHANNEL_ORDER.replace("commentary", "analysis")])
def test_a_call_reads_back_in_either_order_of_its_header_in_any_split(answer: str) -> None:
    for step in (1, 2, 5, len(answer)):
        s = GPT_OSS.syntax.stream([WEATHER])
        pieces = [p for i in range(0, len(answer), step) for p in s.feed(answer[i:i + step])]
        got = fold(pieces + s.close())
        assert (got.content, [(c.name, c.arguments) for c in got.calls]) == ("", [("get_weather", ARGS)]), step


def test_text_is_the_answer_and_an_unknown_function_is_refused() -> None:
    s = GPT_OSS.syntax.stream([WEATHER])
    assert fold(s.feed("It is sunny.") + s.close()).content == "It is sunny."
    s = GPT_OSS.syntax.stream([WEATHER])
    with pytest.raises(ValueError, match="get_time"):
        s.feed(" to=functions.get_time<|channel|>")


def test_the_template_renders_an_earlier_call_as_the_syntax_writes_it_and_the_thought_as_analysis() -> None:
    from service.chat.conversation import Conversation, Turn

    call = ToolCall("get_weather", ARGS, "call_1")
    conv = Conversation([Turn("user", "Weather?"), Turn("assistant", "", (call,), reasoning="EARLIER THOUGHT"),
                         Turn("tool", "12 C", call_id="call_1", name="get_weather")], [WEATHER])
    prompt = ChatTemplate(chat_template("openai-gpt-oss-120b"), "", "").render(conv)
    assert f"<|start|>assistant{GPT_OSS.syntax.render([call])}<|start|>functions.get_weather" in prompt
    assert "<|channel|>analysis<|message|>EARLIER THOUGHT<|end|>" in prompt
    assert prompt.endswith('<|message|>"12 C"<|end|><|start|>assistant')


class Tiny(GrammarVocab):
    """A tiny vocabulary with harmony's special tokens, its llguidance tokenizer and the markup of harmony's
    thought and call markers."""

    def __init__(self, path: Path) -> None:
        family = VocabFamily("harmony-tiny", SPECIALS, "<|startoftext|>", "<|return|>",
                             chat_template("openai-gpt-oss-120b"))
        super().__init__(family, path, [*HARMONY.markers(), *GPT_OSS.syntax.markers()])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return Tiny(tmp_path_factory.mktemp("harmony") / "vocab.gguf")


def test_llama_cpp_shows_the_headers_and_ends_generation_at_call_and_return(tiny: Tiny) -> None:
    ids = {t: tiny.ids(t)[0] for t in SPECIALS}
    assert {t for t in SPECIALS if ids[t] in tiny.vocab.eog_ids} == {"<|endoftext|>", "<|return|>", "<|call|>"}
    assert tiny.vocab.token_bytes[ids["<|channel|>"]] == b"<|channel|>"
    assert set(tiny.markup.specials) == {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                                         "<|call|>"}


def test_the_thought_then_the_call_or_the_final_answer_under_the_grammar(tiny: Tiny) -> None:
    calls = GPT_OSS.syntax.grammar([WEATHER], False, False, tiny.markup)
    source = grammar(HARMONY, tiny.markup, Start.MAYBE, None, calls, framed=True)
    assert tiny.accepts(source, f"<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant{ROLE_ORDER}")
    assert tiny.accepts(source, "<|channel|>final<|message|>Sunny.")
    assert tiny.accepts(source, ROLE_ORDER)
    assert not tiny.accepts(source, "Sunny.")  # an answer is a message: its header first
    free = grammar(HARMONY, tiny.markup, Start.MAYBE, 64)
    assert tiny.accepts(free, "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>Hi")
    assert not tiny.accepts(free, "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant Hi")


def test_the_budget_forces_the_end_and_the_final_header(tiny: Tiny) -> None:
    budget = 5
    m = tiny.matcher(grammar(HARMONY, tiny.markup, Start.MAYBE, budget))
    opening, thought = tiny.ids("<|channel|>analysis<|message|>"), tiny.ids("Once upon a time there was a town")
    assert len(thought) > budget and m.consume_tokens(opening + thought[:budget])
    assert not m.validate_tokens(thought[budget:budget + 1])
    forced = tiny.ids("<|end|><|start|>assistant<|channel|>final<|message|>")
    assert m.validate_tokens(forced) == len(forced)
    assert m.consume_tokens(forced + tiny.ids("Yes.")) and m.is_accepting()
    closed = grammar(HARMONY, tiny.markup, Start.CLOSED, 0)
    assert tiny.accepts(closed, "<|channel|>final<|message|>Yes.")
    assert not tiny.accepts(closed, "<|channel|>analysis<|message|>Hmm.")
