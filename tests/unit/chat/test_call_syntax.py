"""Each family's call syntax: its grammar (llguidance, over a tiny vocabulary in which the family's markers are
special tokens, and one in which they are plain text) accepts the family's own writing of two calls, forced token by
token, and the text of those tokens parses back to exactly the calls, fed whole or in pieces; with
``tool_choice: "auto"`` free text may come first, the trigger starts the calls and nothing but calls may follow it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from service.chat.calls import Function, ToolCall, fold
from service.chat.families import FAMILIES, GENERIC, Family
from service.chat.harmony import FINAL, HarmonyCalls
from service.chat.markup import Markup
from tests.support.grammar_vocab import GrammarVocab
from tests.support.tiny_vocab import CHAT_TEMPLATE, CONTROL
from tests.support.tiny_vocab import Family as VocabFamily

WEATHER = Function("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string", "enum": ["c", "f"]},
    "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}},
    "required": ["city", "days"]})
TIME = Function("get_time", {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]})
FUNCTIONS = [WEATHER, TIME]
CALLS = [ToolCall("get_weather", '{"city": "Paris <b>", "days": 2, "where": {"lat": 48.8}}', "abcdefghi"),
         ToolCall("get_time", '{"zone": "CET"}', "jklmnopqr")]
# Marker texts that are one token in their families' vocabularies.
TOKEN = re.compile(r"｜DSML｜|<\|[^<>|]+\|>|<｜[^<>]+｜>|</?[a-z:_]+>|\[[A-Z_]+\]")
ALL = [GENERIC, *FAMILIES]


def calls_of(family: Family) -> list[ToolCall]:
    return CALLS if family.syntax.parallel else CALLS[:1]


class Model(GrammarVocab):
    """A tiny vocabulary for one family, its llguidance tokenizer and the markup of the family's markers."""

    def __init__(self, family: Family, special: bool, path: Path) -> None:
        markers = family.syntax.markers()
        tokens = sorted({t for m in markers for t in TOKEN.findall(m)}) if special else []
        control = [*CONTROL, *(t for t in tokens if t not in CONTROL)]
        super().__init__(VocabFamily(f"{family.name}-tiny", control, "<|endoftext|>", "<|im_end|>", CHAT_TEMPLATE),
                         path, markers)
        self.tokens = tokens
        shown = list(self.vocab.token_bytes)
        for token, text in self.markup.shown().items():
            shown[token] = text
        self.shown = shown

    def text(self, ids: list[int]) -> str:
        return b"".join(self.shown[t] for t in ids).decode()


@pytest.fixture(scope="module", params=[(f, s) for f in ALL for s in (True, False)],
                ids=[f"{f.name}-{'special' if s else 'text'}" for f in ALL for s in (True, False)])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Model]:
    family, special = request.param
    return family, Model(family, special, tmp_path_factory.mktemp("syntax") / "vocab.gguf")


def parse(family: Family, text: str, step: int) -> Any:
    s = family.syntax.stream(FUNCTIONS)
    pieces = []
    for i in range(0, len(text), step):
        pieces += s.feed(text[i:i + step])
    return fold(pieces + s.close())


def same_calls(got: list[ToolCall], want: list[ToolCall]) -> bool:
    return [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in want]


def test_the_markers_are_special_tokens_where_the_vocabulary_has_them(model: tuple[Family, Model]) -> None:
    _family, m = model
    assert set(m.markup.specials) == set(m.tokens)


def test_forced_calls_follow_the_grammar_and_parse_back_to_exactly_the_calls(model: tuple[Family, Model]) -> None:
    family, m = model
    want = calls_of(family)
    for required in (True, False):
        lead = "Let me check. " if not required and family.syntax.trigger else ""
        ids = m.ids(family.syntax.written(lead, want))
        matcher = m.matcher(family.syntax.grammar(FUNCTIONS, required, True, m.markup))
        assert matcher.validate_tokens(ids) == len(ids), (required, matcher.get_error())
        matcher.consume_tokens(ids)
        assert matcher.is_accepting()
        text = m.text(ids)
        for step in (1, 2, 7, len(text)):
            got = parse(family, text, step)
            assert same_calls(got.calls, want) and got.content == lead, (step, got)


def test_one_call_when_parallel_calls_are_off(model: tuple[Family, Model]) -> None:
    family, m = model
    ids = m.ids(family.syntax.written("", CALLS))
    matcher = m.matcher(family.syntax.grammar(FUNCTIONS, True, False, m.markup))
    one = m.ids(family.syntax.written("", CALLS[:1]))
    assert matcher.validate_tokens(ids) < len(ids) or not family.syntax.parallel
    assert matcher.validate_tokens(one) == len(one)


def test_auto_allows_text_alone_and_only_calls_after_the_trigger(model: tuple[Family, Model]) -> None:
    family, m = model
    grammar = family.syntax.grammar(FUNCTIONS, False, True, m.markup)
    # NOTE: harmony's text is a final-channel message, its header written by the grammar (and dropped by the
    # thought reader before the call parser reads the answer)
    head = FINAL if isinstance(family.syntax, HarmonyCalls) else ""
    text = m.ids(head + family.syntax.written("It is sunny in Paris, no call needed.", []))
    assert m.matcher(grammar).validate_tokens(text) == len(text)
    alone = parse(family, family.syntax.written("It is sunny.", []), 3)
    assert alone.calls == [] and alone.content == "It is sunny."
    opening = family.syntax.trigger or "{"
    bad = m.ids(family.syntax.written("Sure. ", []) + opening + " nothing")
    if not family.syntax.trigger:
        bad = m.ids(opening + " nothing")
    assert m.matcher(grammar).validate_tokens(bad) < len(bad)


def test_an_unknown_function_or_arguments_off_the_schema_are_refused(model: tuple[Family, Model]) -> None:
    family, m = model
    grammar = family.syntax.grammar(FUNCTIONS, True, True, m.markup)
    for call in (ToolCall("get_wheather", '{"city": "Oslo", "days": 1}', "abcdefghi"),
                 ToolCall("get_weather", '{"city": "Oslo", "days": "two"}', "abcdefghi")):
        ids = m.ids(family.syntax.written("", [call]))
        assert m.matcher(grammar).validate_tokens(ids) < len(ids)


def test_the_markup_of_a_vocabulary_without_the_markers_is_plain_text() -> None:
    assert Markup().lark("<tool_call>\n") == '"<tool_call>\\n"'
    assert Markup({"[TOOL_CALLS]": 5}).lark("[TOOL_CALLS]x") == '<[5]> "x"'


def test_schema_keywords_llguidance_does_not_compile_are_left_to_the_final_validation(tmp_path: Path) -> None:
    """``oneOf``, ``uniqueItems``, ``not``: the grammar compiles without them (a superset of the schema); the
    HTTP API validates each call against the function's own schema (tests/unit/http/test_tools.py)."""
    m = Model(GENERIC, False, tmp_path / "vocab.gguf")
    fn = Function("f", {"type": "object", "properties": {
        "a": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        "b": {"type": "array", "uniqueItems": True, "items": {"type": "integer"}}, "c": {"not": {"type": "null"}}},
        "required": ["a"]})
    matcher = m.matcher(GENERIC.syntax.grammar([fn], True, True, m.markup))
    ids = m.ids(GENERIC.syntax.render([ToolCall("f", '{"a": 3, "b": [1, 1]}')]))
    assert matcher.validate_tokens(ids) == len(ids)  # uniqueItems is not in the grammar


def _family(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


@pytest.mark.parametrize("special", [True, False], ids=["special", "text"])
def test_dsml_calls_after_the_templates_blank_line_leave_it_out_of_the_content(tmp_path: Path, special: bool) -> None:
    """DeepSeek's templates write "\\n\\n" before the calls block: the grammar lets the model write it (auto and
    required), and the parser keeps it out of the content."""
    family = _family("deepseek-v3.2")
    m = Model(family, special, tmp_path / "vocab.gguf")
    for required, lead in ((True, ""), (False, "Let me check.")):
        text = lead + "\n\n" + family.syntax.render(CALLS[1:])
        ids = m.ids(text)
        matcher = m.matcher(family.syntax.grammar(FUNCTIONS, required, True, m.markup))
        assert matcher.validate_tokens(ids) == len(ids), matcher.get_error()
        for step in (1, 3, len(text)):
            got = parse(family, m.text(ids), step)
            assert got.content == lead and same_calls(got.calls, CALLS[1:]), (step, got)


@pytest.mark.parametrize("special", [True, False], ids=["special", "text"])
def test_dsml_values_are_typed_by_their_mark_and_a_string_may_hold_markup(tmp_path: Path, special: bool) -> None:
    """string="true" values are raw text (here with a closing tag and a newline: only the ``｜DSML｜`` token, or the
    whole closing text, ends one), string="false" ones JSON under the property's schema."""
    family = _family("deepseek-v4")
    m = Model(family, special, tmp_path / "vocab.gguf")
    call = ToolCall("get_weather", '{"city": "Paris </b>\\nFrance", "days": 3, "units": "c"}')
    text = family.syntax.render([call])
    assert '<｜DSML｜parameter name="city" string="true">Paris </b>\nFrance</｜DSML｜parameter>' in text
    assert '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>' in text
    ids = m.ids(text)
    matcher = m.matcher(family.syntax.grammar(FUNCTIONS, True, True, m.markup))
    assert matcher.validate_tokens(ids) == len(ids), matcher.get_error()
    assert same_calls(parse(family, m.text(ids), 2).calls, [call])
    wrong = m.ids(text.replace('name="days" string="false"', 'name="days" string="true"'))
    assert m.matcher(family.syntax.grammar(FUNCTIONS, True, True, m.markup)).validate_tokens(wrong) < len(wrong)


def test_functionary_v32_output_starts_with_its_recipient(tmp_path: Path) -> None:
    """The prompt wrote the first ">>>": the output is "all\\n" and text (calls may follow, each ">>>NAME\\n"), or
    the first call's name; under "auto" nothing else may start it."""
    family = _family("functionary-v3.2")
    m = Model(family, False, tmp_path / "vocab.gguf")
    assert family.syntax.written("", CALLS) == 'get_weather\n' + family.syntax.render(CALLS)[len(">>>get_weather\n"):]
    assert family.syntax.written("Hi.", CALLS[1:]) == 'all\nHi.>>>get_time\n{"zone": "CET"}'
    grammar = family.syntax.grammar(FUNCTIONS, False, True, m.markup)
    for bad in ("It is sunny.", "get_time {}", "all\nSure.>>>all\nmore"):
        ids = m.ids(bad)
        assert m.matcher(grammar).validate_tokens(ids) < len(ids), bad
    got = parse(family, 'all\nChecking.>>>get_time\n{"zone": "CET"}', 4)
    assert got.content == "Checking." and same_calls(got.calls, CALLS[1:])
