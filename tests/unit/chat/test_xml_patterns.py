"""A ``pattern`` on a bare string value of the XML-style families is enforced by the grammar where it is in
the regex syntax every engine here shares and cannot run past the value's end (anchored, unable to write
the closing text; any pattern before a closing special token); any other is left to the final validation
(``schema_not_enforced``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.chat.calls import Function, ToolCall
from service.chat.families import FAMILIES, Family
from service.chat.xml_calls import _pattern, _value
from tests.unit.chat.test_call_syntax import Model

XML = [f for f in FAMILIES if f.syntax.kind == "xml"]
CODE = Function("book", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                                           "note": {"type": "string", "pattern": "[0-9]"}},
                         "required": ["code", "note"]})


@pytest.mark.parametrize("special", [True, False], ids=["special", "text"])
@pytest.mark.parametrize("family", XML, ids=[f.name for f in XML])
def test_the_grammar_holds_a_values_pattern(family: Family, special: bool, tmp_path: Path) -> None:
    m = Model(family, special, tmp_path / "vocab.gguf")
    grammar = family.syntax.grammar([CODE], True, False, m.markup)
    good = m.ids(family.syntax.render([ToolCall("book", '{"code": "OSL", "note": "gate 7"}')]))
    assert m.matcher(grammar).validate_tokens(good) == len(good)
    for args in ('{"code": "osl", "note": "gate 7"}', '{"code": "OSLO", "note": "gate 7"}'):
        bad = m.ids(family.syntax.render([ToolCall("book", args)]))
        assert m.matcher(grammar).validate_tokens(bad) < len(bad), args


@pytest.mark.parametrize("schema", [
    {"pattern": "^(?=a)b$"}, {"pattern": r"\bword"}, {"pattern": r"(a)\1"}, {"pattern": "a/b"},
    {"pattern": "a$|^b"}, {"pattern": "[unclosed"}, {"pattern": "^[a-z]+$", "maxLength": 4},
    {"pattern": r"\p{L}+"}, {"pattern": ""},
])
def test_patterns_outside_the_shared_syntax_are_left_to_the_final_validation(schema: dict[str, str]) -> None:
    assert _pattern({"type": "string", **schema}) is None


def test_an_anchored_pattern_is_the_whole_value_and_another_is_searched() -> None:
    assert _pattern({"pattern": "^[A-Z]{3}$"}) == "(?:[A-Z]{3})"
    assert _pattern({"pattern": "[0-9]"}) == "(?s:.*)(?:[0-9])(?s:.*)"
    assert _pattern({"pattern": r"^a\$"}) == r"(?:a\$)(?s:.*)"


@pytest.mark.parametrize(("pattern", "enforced"), [
    ("^[A-Z]{3}$", True), (r"^\d+(?:\.\d+)?$", True), ("^[^x]+$", False), ("^.+$", False), ("^[<>]$", False),
    (r"^\D$", False), ("[0-9]", False), ("^a<b$", False),
])
def test_a_value_ended_by_text_takes_only_patterns_that_cannot_run_past_its_end(pattern: str,
                                                                                enforced: bool) -> None:
    got = _value({"type": "string", "pattern": pattern}, "</parameter>")
    assert (got != "(?s:.*)") == enforced
    assert _value({"type": "string", "pattern": "[0-9]"}) == "(?s:.*)(?:[0-9])(?s:.*)"  # before a special token
