"""The shortest valid completion of a JSON document (service/grammar/completion.py), without model weights.

Needs only the default model's vocabulary (a vocab-only load).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from service import json_grammar as jg
from service.grammar.examples import pattern_example, schema_hints

pytestmark = pytest.mark.vocab  # reads the default model's vocabulary (no weights)

OBJ = {"type": "object", "additionalProperties": False}
# (name, schema, the completion forced from the start)
HAND_MADE: list[tuple[str, dict[str, Any], str]] = [
    (
        "nested required objects",
        {**OBJ, "properties": {"a": {**OBJ, "properties": {"b": {"type": "integer"}}, "required": ["b"]}}, "required": ["a"]},
        '{"a":{"b":0}}',
    ),
    (
        "array with minItems",
        {**OBJ, "properties": {"xs": {"type": "array", "items": {"type": "string"}, "minItems": 3}}, "required": ["xs"]},
        '{"xs":["","",""]}',
    ),
    (
        "optional properties left out",
        {**OBJ, "properties": {"x": {"type": "string"}, "y": {"type": "integer"}, "z": {"type": "boolean"}}, "required": ["y"]},
        '{"y":0}',
    ),
    (
        "enum",
        {**OBJ, "properties": {"e": {"enum": ["apple", "banana", "kiwi"]}}, "required": ["e"]},
        '{"e":"apple"}',
    ),
    (
        "pattern",
        {**OBJ, "properties": {"p": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"}}, "required": ["p"]},
        '{"p":"a@a.com"}',
    ),
    (
        "unanchored word pattern",
        {**OBJ, "properties": {"t": {"type": "string", "pattern": "rocket_document"}}, "required": ["t"]},
        '{"t":"rocket_document"}',
    ),
    (
        "minLength and bounds",
        {**OBJ, "properties": {"n": {"type": "string", "minLength": 5}, "k": {"type": "integer", "minimum": 18}}, "required": ["n", "k"]},
        '{"n":"aaaaa","k":100}',
    ),
    (
        "formats",
        {**OBJ, "properties": {"d": {"type": "string", "format": "date"}, "u": {"type": "string", "format": "uuid"}}, "required": ["d", "u"]},
        '{"d":"1111-11-11","u":"aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"}',
    ),
    ("top-level number", {"type": "number"}, "0"),
    ("any JSON value", {}, "0"),
]


@pytest.fixture(scope="module")
def compiler(model_vocab: Any) -> Any:
    comp = jg.GrammarCompiler(model_vocab.ll_tokenizer())
    yield comp
    comp.close()


def text_of(model_vocab: Any, tokens: list[int]) -> str:
    return b"".join(model_vocab.token_bytes[t] for t in tokens).decode("utf-8")


def force(matcher: jg.GrammarMatcher, tokens: list[int]) -> None:
    for t in tokens:
        matcher.consume(t)


@pytest.mark.parametrize(("name", "schema", "expected"), HAND_MADE, ids=[h[0] for h in HAND_MADE])
def test_min_tokens_is_the_length_of_the_completion_forced_from_the_start(
    compiler: Any, model_vocab: Any, name: str, schema: dict[str, Any], expected: str
) -> None:
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    m = compiler.matcher(compiled)
    completion = m.completion(10_000)
    assert completion is not None
    assert compiled.min_tokens == len(completion)
    force(m, completion)
    assert m.is_accepting()
    assert text_of(model_vocab, completion) == expected
    jg.validate_document(compiled, expected)


@pytest.mark.parametrize(("name", "schema", "expected"), HAND_MADE[:7], ids=[h[0] for h in HAND_MADE[:7]])
def test_completion_from_every_cut_of_a_valid_document_validates(
    compiler: Any, model_vocab: Any, name: str, schema: dict[str, Any], expected: str
) -> None:
    document = {
        "nested required objects": '{"a":{"b":12345}}',
        "array with minItems": '{"xs":["one","two","three","four"]}',
        "optional properties left out": '{"x":"some text here","y":42,"z":true}',
        "enum": '{"e":"banana"}',
        "pattern": '{"p":"someone@example.com"}',
        "unanchored word pattern": '{"t":"my rocket_document here"}',
        "minLength and bounds": '{"n":"abcdefgh","k":42}',
    }[name]
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    tokens = model_vocab.tokenize(document, add_special=False, parse_special=False)
    for cut in range(len(tokens) + 1):
        m = compiler.matcher(compiled)
        force(m, tokens[:cut])
        completion = m.completion(10_000)
        assert completion is not None, f"no completion after {text_of(model_vocab, tokens[:cut])!r}"
        force(m, completion)
        assert m.is_accepting()
        jg.validate_document(compiled, text_of(model_vocab, tokens[:cut] + completion))


def test_completion_longer_than_the_limit_is_none(compiler: Any) -> None:
    compiled, _, _ = compiler.compile("json_schema", json.dumps(HAND_MADE[0][1]))
    m = compiler.matcher(compiled)
    assert compiled.min_tokens is not None and compiled.min_tokens > 2
    assert m.completion(compiled.min_tokens - 1) is None
    assert m.completion(compiled.min_tokens) is not None


def test_fork_is_independent_and_nothing_is_consumed(compiler: Any, model_vocab: Any) -> None:
    compiled, _, _ = compiler.compile("json_schema", json.dumps(HAND_MADE[0][1]))
    m = compiler.matcher(compiled)
    first = m.completion(100)
    assert first is not None
    ahead = m.fork()
    force(ahead, first)
    assert ahead.is_accepting() and not m.is_accepting()
    assert m.completion(100) == first


def test_non_json_grammars_have_no_completion(compiler: Any) -> None:
    compiled, _, _ = compiler.compile("regex", "[a-z]{3}")
    assert compiled.min_tokens is None
    assert compiler.matcher(compiled).completion(100) is None


@pytest.mark.parametrize(
    ("pattern", "example"),
    [
        ("^[a-z]+@[a-z]+\\.com$", "a@a.com"),
        ("\\d{4}-\\d{2}-\\d{2}", "1111-11-11"),
        ("^(foo|ba)[^x]$", "baa"),
        ("rocket_document", "rocket_document"),
        ("(?<=a)b", "b"),  # look-behind: Python can still check the example; None if it does not match
    ],
)
def test_pattern_examples_match_their_pattern(pattern: str, example: str) -> None:
    found = pattern_example(pattern)
    if found is not None:
        import re

        assert re.search(pattern, found)
    assert found == example or (pattern.startswith("(?<=") and found is None)


def test_schema_hints_are_json_escaped_and_distinct() -> None:
    assert schema_hints(['^"x"$', '^"x"$', "(unclosed"]) == (b'\\"x\\"',)


def test_forced_completion_is_valid_json_for_a_draft_07_schema(compiler: Any, model_vocab: Any) -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/definitions/item"}, "minItems": 1}},
        "required": ["items"],
        "definitions": {"item": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
    }
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    completion = compiler.matcher(compiled).completion(100)
    assert completion is not None
    jsonschema.validate(json.loads(text_of(model_vocab, completion)), schema)


# (schema, a document cut where the completion must write an object key or close one, the
# completion expected): additionalProperties defaults to true, so llguidance's grammar would
# take a key already present; the completion must never write one.
REPEATED_KEYS: list[tuple[dict[str, Any], str, str]] = [
    ({"type": "object"}, '{"Mike":1,"Mike', 'a":0}'),  # the fuzz failure: cut inside a key present
    ({"type": "object"}, '{"Mike":1,"Mi', '":0}'),
    ({"type": "object", "minProperties": 2}, '{"":1', ',"a":0}'),
    ({"type": "object", "minProperties": 3}, "{", ""),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, '{"a":1,"a', 'a":0}'),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "minProperties": 2}, '{"x":1,"x', 'a":0}'),
    ({"type": "object", "properties": {"o": {"type": "object"}}}, '{"o":{"o":{"k":1,"k', 'a":0}}}'),
]


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate key in {keys}"
    return dict(pairs)


@pytest.mark.parametrize(("schema", "cut", "rest"), REPEATED_KEYS, ids=[c for _, c, _ in REPEATED_KEYS])
def test_completion_never_writes_a_key_already_in_its_object(
    compiler: Any, model_vocab: Any, schema: dict[str, Any], cut: str, rest: str
) -> None:
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    m = compiler.matcher(compiled)
    tokens = model_vocab.tokenize(cut, add_special=False, parse_special=False)
    force(m, tokens)
    ahead = m.fork()  # the look-ahead's fork: the keys its completion writes stay in the fork
    assert ahead.completion(100) is not None
    completion = m.completion(100)
    assert completion is not None
    text = cut + text_of(model_vocab, completion)
    json.loads(text, object_pairs_hook=_no_duplicate_keys)
    jg.validate_document(compiled, text)
    if rest:
        assert text == cut + rest
    force(m, completion)
    assert m.is_accepting()


def test_a_fork_keeps_the_keys_it_reads_to_itself(compiler: Any, model_vocab: Any) -> None:
    """The look-ahead's fork reads a token the engine may then drop: its key must not count in the original."""
    compiled, _, _ = compiler.compile("json_schema", json.dumps({"type": "object"}))
    tokenize = lambda s: model_vocab.tokenize(s, add_special=False, parse_special=False)  # noqa: E731
    m = compiler.matcher(compiled)
    force(m, tokenize('{"k":1,'))
    ahead = m.fork()
    force(ahead, tokenize('"Mike":2'))
    assert ahead.completion(100) is not None
    force(m, tokenize('"Mike'))
    completion = m.completion(100)
    assert completion is not None
    assert text_of(model_vocab, completion) == '":0}'
