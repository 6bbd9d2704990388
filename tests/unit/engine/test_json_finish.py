"""Budget-aware completion in the token appender (service/engine/json_finish.py), without model weights.

A scripted "model" writes a document that never ends (one string, on and on);
the appender must close it in time: FINISH_REASON_CLOSED within max_tokens, a
complete document that validates. Needs only the default model's vocabulary.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from service import json_grammar as jg
from service.engine.token_appender import TokenAppender
from service.request.constraints import FinishBudget
from service.request.sequence import FinishReason, SamplingParams, Sequence

pytestmark = pytest.mark.vocab  # reads the default model's vocabulary (no weights)
CHARACTER = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "description": {"type": "string"}},
    "required": ["name", "description"],
}
NESTED = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 2,
            "items": {
                "type": "object",
                "properties": {"bio": {"type": "string"}, "age": {"type": "integer"}, "tag": {"enum": ["x", "y"]}},
                "required": ["bio", "age", "tag"],
            },
        },
        "count": {"type": "integer"},
    },
    "required": ["people", "count"],
}
LOOP = "He is very brave and good. "


@pytest.fixture(scope="module")
def compiler(model_vocab: Any) -> Any:
    comp = jg.GrammarCompiler(model_vocab.ll_tokenizer())
    yield comp
    comp.close()


def run_scripted(model_vocab: Any, compiler: Any, schema: dict[str, Any], target: str, max_tokens: int) -> Sequence:
    """Append, token by token, the model's tokenization of what is left of ``target`` (an endless document)."""
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    seq = Sequence(request_id="r", token_ids=[1], params=SamplingParams(max_tokens=max_tokens, json_finish=True))
    seq.matcher, seq.grammar = compiler.matcher(compiled), compiled
    seq.budget = FinishBudget(known=compiled.min_tokens or 0)
    appender = TokenAppender(model_vocab.eog_ids, model_vocab.token_bytes)
    while seq.finish_reason is None:
        written = b"".join(model_vocab.token_bytes[t] for t in seq.token_ids[1:]).decode("utf-8")
        assert target.startswith(written), (target[:80], written)
        token = model_vocab.tokenize(target[len(written) :], add_special=False, parse_special=False)[0]
        seq.finish_reason = appender(seq, token)
    return seq


def document(model_vocab: Any, seq: Sequence) -> str:
    return b"".join(model_vocab.token_bytes[t] for t in seq.token_ids[1:]).decode("utf-8")


@pytest.mark.parametrize("max_tokens", [8, 9, 10, 13, 20, 41, 100])  # the shortest document is 8 tokens
def test_an_endless_string_is_closed_within_max_tokens(model_vocab: Any, compiler: Any, max_tokens: int) -> None:
    seq = run_scripted(model_vocab, compiler, CHARACTER, '{"name":"' + LOOP * 200, max_tokens)
    assert seq.finish_reason is FinishReason.CLOSED
    assert seq.num_generated <= max_tokens
    doc = json.loads(document(model_vocab, seq))
    assert set(doc) == {"name", "description"}
    assert (LOOP * 200).startswith(doc["name"])


@pytest.mark.parametrize("spare", [0, 1, 2, 7, 30, 60])
def test_an_endless_nested_document_is_closed_with_its_required_parts(model_vocab: Any, compiler: Any, spare: int) -> None:
    compiled, _, _ = compiler.compile("json_schema", json.dumps(NESTED))
    max_tokens = compiled.min_tokens + spare
    target = '{"people":[{"bio":"' + LOOP * 100
    seq = run_scripted(model_vocab, compiler, NESTED, target, max_tokens)
    assert seq.finish_reason is FinishReason.CLOSED
    assert seq.num_generated <= max_tokens
    text = document(model_vocab, seq)
    jg.validate_document(seq.grammar, text)
    assert len(json.loads(text)["people"]) == 2  # minItems filled in


def test_a_document_that_fits_ends_naturally(model_vocab: Any, compiler: Any) -> None:
    seq = run_scripted(model_vocab, compiler, CHARACTER, '{"name":"Ava","description":"A knight."}', 40)
    assert seq.finish_reason is FinishReason.STOP
    assert document(model_vocab, seq) == '{"name":"Ava","description":"A knight."}'


def test_below_the_shortest_document_nothing_can_be_closed(model_vocab: Any, compiler: Any) -> None:
    """The intake refuses such a request up front (OUT_OF_RANGE); the engine alone cuts it off."""
    compiled, _, _ = compiler.compile("json_schema", json.dumps(NESTED))
    seq = run_scripted(model_vocab, compiler, NESTED, '{"people":[{"bio":"' + LOOP * 100, compiled.min_tokens - 1)
    assert seq.finish_reason is FinishReason.LENGTH
