"""Unit tests of the structured-output core (service/json_grammar.py).

Runs on the tiny built vocabulary (``tiny_vocab``, tests/support/tiny_vocab.py): no model file.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import llguidance as llg
import numpy as np
import pytest

from service import json_grammar as jg

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def vocab(tiny_vocab: Any) -> Any:
    return tiny_vocab


@pytest.fixture(scope="module")
def ll_tok(vocab: Any) -> Any:
    return vocab.ll_tokenizer()


@pytest.fixture()
def compiler(ll_tok: Any) -> Any:
    comp = jg.GrammarCompiler(ll_tok)
    yield comp
    comp.close()


def toks(vocab: Any, text: str) -> list[int]:
    return vocab.tokenize(text, add_special=False, parse_special=False)


def accepts(compiler: Any, compiled: jg.CompiledGrammar, vocab: Any, text: str) -> bool:
    m = compiler.matcher(compiled)
    try:
        for t in toks(vocab, text):
            m.consume(t)
    except jg.GrammarError:
        return False
    return m.is_accepting()


# -- compile and cache --------------------------------------------------------------------------
def test_compile_and_cache_hit(compiler: Any) -> None:
    src = json.dumps(PERSON)
    c1, hit1, ms1 = compiler.compile("json_schema", src)
    c2, hit2, _ = compiler.compile("json_schema", src)
    assert (hit1, hit2) == (False, True)
    assert c1 is c2 and c1.kind == "json_schema" and c1.schema == PERSON and c1.approximations == ()
    assert ms1 > 0
    with pytest.raises(jg.GrammarError):  # same text, other kind: another entry (an invalid regex)
        compiler.compile("regex", src)
    assert compiler.compile("lark", 'start: "a"')[1] is False


def test_cache_is_bounded_lru(ll_tok: Any) -> None:
    comp = jg.GrammarCompiler(ll_tok, cache_size=2)
    try:
        for src in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" arrives
            comp.compile("regex", src)
        assert comp.compile("regex", "a")[1] is True
        assert comp.compile("regex", "b")[1] is False
    finally:
        comp.close()


def test_concurrent_compiles_of_one_source_compile_once(compiler: Any) -> None:
    src = json.dumps({"type": "array", "items": PERSON})
    results: list[tuple[Any, bool, float]] = []
    threads = [
        threading.Thread(target=lambda: results.append(compiler.compile("json_schema", src)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r[0]) for r in results}) == 1
    assert sum(not r[1] for r in results) == 1


# -- bad input ----------------------------------------------------------------------------------
CIRCULAR = {
    "definitions": {
        "Child": {"type": "object"},
        "Foo": {
            "type": "object",
            "required": ["kids"],
            "properties": {
                "kids": {"allOf": [{"$ref": "#/definitions/Foo"}, {"$ref": "#/definitions/Child"}]}
            },
        },
    },
    "$ref": "#/definitions/Foo",
}
INVALID = "INVALID_ARGUMENT"
BAD = [
    ("json_schema", "{not json", INVALID, "not valid JSON"),
    ("json_schema", "[1, 2]", INVALID, "must be a JSON object"),
    ("json_schema", '{"type": "strin"}', INVALID, "invalid JSON Schema"),
    ("json_schema", '{"type": "object", "required": "name"}', INVALID, "invalid JSON Schema at required"),
    ("json_schema", json.dumps(CIRCULAR), INVALID, "circular references"),
    ("json_schema", '{"$ref": "https://example.com/s.json"}', INVALID, "https://example.com/s.json"),
    ("json_schema", '{"allOf": [{"type": "string"}, {"type": "integer"}]}', INVALID, "Unsatisfiable"),
    ("json_schema", "[" * 5000 + "]" * 5000, INVALID, "nested too deeply"),
    ("regex", "(a|b", INVALID, "unclosed group"),
    ("regex", "(?=a)b", INVALID, "look-around"),
    ("lark", "start: foo", INVALID, "unknown name"),
    ("lark", "start: (", INVALID, "lark grammar error"),
    ("gbnf", 'root ::= "a" (', INVALID, "GBNF syntax error"),
    ("yaml", "x: 1", INVALID, "unknown constraint kind"),
]


@pytest.mark.parametrize(("kind", "source", "status", "needle"), BAD, ids=[f"{b[0]}:{b[3]}" for b in BAD])
def test_bad_input_is_a_clear_error(compiler: Any, kind: str, source: str, status: str, needle: str) -> None:
    with pytest.raises(jg.GrammarError) as ei:
        compiler.compile(kind, source)
    assert ei.value.status == status
    assert needle in str(ei.value)
    with pytest.raises(jg.GrammarError):  # errors are cached, and raised again
        compiler.compile(kind, source)


def test_source_over_size_limit(ll_tok: Any) -> None:
    comp = jg.GrammarCompiler(ll_tok, max_source_bytes=100)
    with pytest.raises(jg.GrammarError) as ei:
        comp.compile("regex", "a" * 101)
    assert ei.value.status == "INVALID_ARGUMENT" and "limit is 100" in str(ei.value)  # permanent: never retried
    comp.close()


def test_grammar_over_parser_limits(ll_tok: Any) -> None:
    comp = jg.GrammarCompiler(ll_tok, limits=llg.LLParserLimits(max_grammar_size=1_000))
    lark = "start: " + " | ".join(f'"w{i}"' for i in range(2_000))
    with pytest.raises(jg.GrammarError) as ei:
        comp.compile("lark", lark)
    assert ei.value.status == "INVALID_ARGUMENT" and "too big" in str(ei.value)
    comp.close()


def test_compile_timeout(ll_tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    comp = jg.GrammarCompiler(ll_tok, compile_timeout_s=0.05)
    real = comp._build
    release = threading.Event()

    def slow_build(kind: str, source: str) -> jg.CompiledGrammar:
        assert release.wait(30)  # held until the caller has timed out
        return real(kind, source)

    monkeypatch.setattr(comp, "_build", slow_build)
    with pytest.raises(jg.GrammarError) as ei:
        comp.compile("regex", "abc")
    assert ei.value.status == "RESOURCE_EXHAUSTED" and "exceeded" in str(ei.value)
    release.set()  # the abandoned compile finishes: the timeout was not cached, the result is
    pending, _ = comp.start("regex", "abc")
    pending.result(timeout=30)
    compiled, hit, _ = comp.compile("regex", "abc")
    assert hit and compiled.kind == "regex"
    comp.close()


# -- approximations -----------------------------------------------------------------------------
APPROX = [
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf->anyOf", "3.5", "3"),
    (
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        "ignored: uniqueItems",
        "[1,2]",
        "[1,1]",
    ),
    ({"type": "string", "format": "xyz"}, "format:xyz ignored", '"abc"', None),
    ({"type": "integer", "not": {"const": 3}}, "ignored: not", "4", "3"),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "if": {"required": ["a"]},
            "then": {"required": ["b"]},
        },
        "ignored: if, then",
        '{"a":1,"b":2}',
        '{"a":1}',
    ),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1},
        "ignored: minProperties/maxProperties",
        '{"a":1}',
        "{}",
    ),
    (
        {"type": "string", "pattern": "^(?!x)[a-z]+$"},
        "ignored: pattern unsupported by the grammar engine",
        '"abc"',
        '"xbc"',
    ),
]


@pytest.mark.parametrize(("schema", "label", "good", "bad"), APPROX, ids=[a[1] for a in APPROX])
def test_approximated_features(
    compiler: Any, vocab: Any, schema: dict[str, Any], label: str, good: str, bad: str | None
) -> None:
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    assert label in compiled.approximations, compiled.approximations
    assert accepts(compiler, compiled, vocab, good)
    jg.validate_document(compiled, good)
    if bad is not None:  # the grammar lets it through; the final validation does not
        assert accepts(compiler, compiled, vocab, bad)
        with pytest.raises(jg.SchemaNotEnforced) as ei:
            jg.validate_document(compiled, bad)
        assert ei.value.status == "INVALID_ARGUMENT" and label in str(ei.value)


def test_keyword_names_as_property_names_are_kept(compiler: Any, vocab: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"not": {"type": "integer"}, "format": {"type": "string"}},
        "required": ["not"],
        "additionalProperties": False,
        "not": {"required": ["format"]},
    }
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    assert compiled.approximations == ("ignored: not",)
    assert accepts(compiler, compiled, vocab, '{"not":1}')
    assert not accepts(compiler, compiled, vocab, "{}")
    assert accepts(compiler, compiled, vocab, '{"not":1,"format":"x"}')  # the dropped `not` ...
    with pytest.raises(jg.GrammarError):  # ... is enforced by the final validation
        jg.validate_document(compiled, '{"not":1,"format":"x"}')


def test_validation_never_fetches_remote_refs() -> None:
    import jsonschema

    from service.grammar import schema as gs

    validator = gs.make_validator({"$ref": "http://127.0.0.1:9/schema.json"}, jsonschema.Draft202012Validator)
    assert "unresolvable" in str(gs.document_problem(validator, "1"))


def test_client_x_guidance_cannot_change_layout(compiler: Any, vocab: Any) -> None:
    schema = dict(PERSON, **{"x-guidance": {"whitespace_flexible": True, "lenient": True}})
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    assert accepts(compiler, compiled, vocab, '{"name":"Al","age":3}')
    assert not accepts(compiler, compiled, vocab, '{"name": "Al", "age": 3}')


# -- other kinds ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "source"),
    [
        ("regex", "(yes|no)"),
        ("lark", 'start: "yes" | "no"'),
        ("gbnf", 'root ::= "yes" | "no"'),
    ],
)
def test_regex_lark_gbnf(compiler: Any, vocab: Any, kind: str, source: str) -> None:
    compiled, _, _ = compiler.compile(kind, source)
    assert compiled.kind == kind and compiled.schema is None
    assert accepts(compiler, compiled, vocab, "yes") and accepts(compiler, compiled, vocab, "no")
    assert not accepts(compiler, compiled, vocab, "maybe")
    jg.validate_document(compiled, "anything")  # no-op for non-JSON kinds


# -- matcher --------------------------------------------------------------------------------------
def test_matcher_forced_consume_stopped(compiler: Any, vocab: Any, ll_tok: Any) -> None:
    compiled, _, _ = compiler.compile("json_schema", json.dumps(PERSON))
    m = compiler.matcher(compiled)
    forced = m.forced_tokens()
    assert ll_tok.decode_str(forced) == '{"name'  # the grammar forces the object start and first key
    assert m.forced_tokens() == forced  # not consumed
    for t in forced:
        m.consume(t)
    for t in toks(vocab, '":"Bo","'):
        m.consume(t)
    assert ll_tok.decode_str(m.forced_tokens()).startswith("age")
    assert not m.is_accepting() and not m.is_stopped()
    for t in toks(vocab, 'age":7}'):
        m.consume(t)
    assert m.is_accepting() and m.is_stopped() and m.forced_tokens() == []
    assert m.error() is None


def test_matcher_free_choice_and_rejection(compiler: Any, vocab: Any) -> None:
    compiled, _, _ = compiler.compile("regex", "ab+")
    m = compiler.matcher(compiled)
    for t in toks(vocab, "ab"):
        m.consume(t)
    assert m.is_accepting() and not m.is_stopped()
    assert m.forced_tokens() == []  # "b" or end: nothing is forced
    with pytest.raises(jg.GrammarError) as ei:
        m.consume(toks(vocab, "x")[0])
    # The mask never allows such a token; when llguidance's mask and parser disagree (bytes the
    # vocabulary cannot produce) the constraint is at fault: FAILED_PRECONDITION, never INTERNAL.
    assert ei.value.status == "FAILED_PRECONDITION" and "refused" in str(ei.value)
    assert m.error() is not None and m.is_stopped()


def test_matchers_are_independent(compiler: Any, vocab: Any) -> None:
    compiled, _, _ = compiler.compile("regex", "(yes|no)")
    a, b = compiler.matcher(compiled), compiler.matcher(compiled)
    for t in toks(vocab, "yes"):
        a.consume(t)
    assert a.is_accepting() and not b.is_accepting()
    for t in toks(vocab, "no"):
        b.consume(t)
    assert b.is_accepting()


# -- masks ----------------------------------------------------------------------------------------
def allowed_set(compiler: Any, compiled: jg.CompiledGrammar, n_vocab: int) -> set[int]:
    """Tokens a fresh matcher accepts, asked one token at a time (not via a mask)."""
    m = compiler.matcher(compiled)
    return {t for t in range(n_vocab) if m.validate([t]) == 1}


def test_mask_batch_masks_constrained_rows_only(compiler: Any, vocab: Any, ll_tok: Any) -> None:
    n_vocab = vocab.n_vocab + 13  # the model's logits may be wider than the tokenizer's vocabulary
    a, _, _ = compiler.compile("regex", "(yes|no)[!?]")
    b, _, _ = compiler.compile("json_schema", json.dumps({"type": "integer"}))
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, n_vocab)).astype(np.float32)
    before = logits.copy()
    batch = jg.MaskBatch(ll_tok, n_vocab, max_rows=1)  # grows on demand
    us = batch.fill_and_apply([compiler.matcher(a), compiler.matcher(b)], logits, [0, 2])
    assert us > 0
    for row, compiled in ((0, a), (2, b)):
        finite = set(np.flatnonzero(np.isfinite(logits[row])).tolist())
        assert finite == allowed_set(compiler, compiled, vocab.n_vocab)
        assert np.isneginf(logits[row, vocab.n_vocab :]).all()
        np.testing.assert_array_equal(logits[row, sorted(finite)], before[row, sorted(finite)])
    assert toks(vocab, "yes")[0] in set(np.flatnonzero(np.isfinite(logits[0])).tolist())
    assert not np.isfinite(logits[2, toks(vocab, "yes")[0]])
    np.testing.assert_array_equal(logits[1], before[1])  # unconstrained rows are untouched
    np.testing.assert_array_equal(logits[3], before[3])


def test_parser_limit_hit_while_masking(compiler: Any, vocab: Any, ll_tok: Any) -> None:
    # A bounded-repetition pattern intersected with maxLength needs more lexer work per
    # step than the limits allow: the matcher fails closed, its row allows only EOS.
    schema = {"type": "string", "maxLength": 5000, "pattern": "^$|(^(?:\\S+\\s+){0,99}\\S+$)"}
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    m, batch = compiler.matcher(compiled), jg.MaskBatch(ll_tok, vocab.n_vocab, 1)
    for t in toks(vocab, '"What is the primary function of the human brain'):
        logits = np.zeros((1, vocab.n_vocab), dtype=np.float32)
        batch.fill_and_apply([m], logits, [0])
        if m.error() is not None:
            break
        m.consume(t)
    err = m.error()
    assert err is not None and err.status == "RESOURCE_EXHAUSTED", err
    assert set(np.flatnonzero(np.isfinite(logits[0])).tolist()) <= set(vocab.eog_ids)


def test_mask_after_progress_and_at_end(compiler: Any, vocab: Any, ll_tok: Any) -> None:
    compiled, _, _ = compiler.compile("regex", "ab")
    m = compiler.matcher(compiled)
    for t in toks(vocab, "ab"):
        m.consume(t)
    logits = np.zeros((1, vocab.n_vocab), dtype=np.float32)
    jg.MaskBatch(ll_tok, vocab.n_vocab, 1).fill_and_apply([m], logits, [0])
    finite = set(np.flatnonzero(np.isfinite(logits[0])).tolist())
    assert finite and finite <= set(vocab.eog_ids)  # only end-of-generation remains


# -- final validation -----------------------------------------------------------------------------
def test_validate_document(compiler: Any) -> None:
    compiled, _, _ = compiler.compile("json_schema", json.dumps(PERSON))
    jg.validate_document(compiled, '{"name":"Al","age":3}')
    for bad, needle in [
        ('{"name":"Al","age":-1}', "breaks 'minimum' at /age"),
        ('{"name":"Al"}', "'age' is a required property"),
        ('{"name":"Al","age":3', "not valid JSON"),
        ('{"name":"Al","name":"Bo","age":3}', "duplicate key"),
        ('{"name":"Al","age":NaN}', "not valid JSON"),
    ]:
        with pytest.raises(jg.SchemaNotEnforced) as ei:
            jg.validate_document(compiled, bad)
        assert ei.value.status == "INVALID_ARGUMENT" and needle in str(ei.value), str(ei.value)


def test_final_check_failure_names_the_unenforced_keyword_and_its_path(compiler: Any, vocab: Any) -> None:
    schema = {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"enum": ["a"]}, "minItems": 2, "uniqueItems": True}}, "required": ["tags"]}
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    assert accepts(compiler, compiled, vocab, '{"tags":["a","a"]}')  # the only documents the grammar allows
    with pytest.raises(jg.SchemaNotEnforced) as ei:
        jg.validate_document(compiled, '{"tags":["a","a"]}')
    assert (ei.value.violation.keyword, ei.value.violation.path) == ("uniqueItems", "/tags")
    assert ei.value.approximations == ("ignored: uniqueItems",)
    assert str(ei.value).startswith("document breaks 'uniqueItems' at /tags: ")
    assert "could not enforce it (schema compiled with approximations: ignored: uniqueItems)" in str(ei.value)


def test_validate_document_checks_formats(compiler: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "home": {"type": "string", "format": "iri"},
            "ip": {"type": "string", "format": "ipv4"},
        },
    }
    compiled, _, _ = compiler.compile("json_schema", json.dumps(schema))
    assert "format:iri ignored" in compiled.approximations
    jg.validate_document(compiled, '{"home":"https://example.org/ü","ip":"10.0.0.1"}')
    with pytest.raises(jg.GrammarError):
        jg.validate_document(compiled, '{"home":"not an iri"}')
