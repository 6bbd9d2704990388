"""GenerateJSONRequest.pretty: compact JSON laid out without re-serialising (service/api/json_layout.py)."""

from __future__ import annotations

import json

import pytest

from service.api.json_layout import pretty_json

DOCS = [
    '{"a":[1,2,{}],"b":{"c":"x,{y}:\\"]"},"d":[],"e":null}',
    '[{"k":true},[[]],"s",-0.5]',
    '"just a string with {braces}, commas: and \\\\"',
    "0",
]


@pytest.mark.parametrize("text", DOCS)
def test_pretty_layout_is_json_dumps_indent_2_and_keeps_the_document(text: str) -> None:
    out = pretty_json(text)
    assert json.loads(out) == json.loads(text)
    assert out == json.dumps(json.loads(text), indent=2, ensure_ascii=False)


def test_numbers_keep_their_spelling() -> None:
    assert pretty_json('{"n":1E+2}') == '{\n  "n": 1E+2\n}'
