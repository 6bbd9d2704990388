"""Structured output on llguidance: compile constraints, match tokens, mask logits, validate.

Four constraint kinds: ``json_schema`` (compact JSON; unsupported schema
features approximated by ``grammar_schema.relax`` and restored by the final
``validate_document``), ``regex``, ``lark`` (llguidance's Lark dialect) and
``gbnf`` (llama.cpp GBNF, converted to Lark with llguidance's
``gbnf_to_lark``; llama.cpp's own grammar sampler is never used).

Threads: ``GrammarCompiler.compile`` is called from worker threads;
``GrammarMatcher`` and ``MaskBatch`` (service/grammar/mask.py, re-exported
here) belong to the engine thread.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import llguidance as llg
import numpy as np
from llguidance.gbnf_to_lark import gbnf_to_lark

from service.grammar import schema as gs
from service.grammar.cache import GrammarCache
from service.grammar.completion import Completer
from service.grammar.examples import schema_hints
from service.grammar.json_keys import JsonScan
from service.grammar.mask import MaskBatch

__all__ = [
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "MaskBatch",
    "SchemaNotEnforced",
    "validate_document",
]

KINDS = ("json_schema", "regex", "lark", "gbnf")
MAX_RELAX_PASSES = 12
# Compact JSON, fixed by the service (a client's "x-guidance" is removed).
JSON_OPTIONS: dict[str, Any] = {"item_separator": ",", "key_separator": ":", "whitespace_flexible": False}
_LIMIT_WORDS = ("too big", "limit for this grammar", "too many", "fuel", "too complex")
# NOTE: estimated resident bytes of a compiled grammar per byte of its llguidance grammar
# text (the matcher prototype's lexer and parser tables dominate); measured with
# scripts/grammar_cache_size.py: 599 dev schemas, 0.42 MB of grammar text, RssAnon
# +88 MB = 207 bytes per byte (147 kB per grammar on average).
BYTES_PER_GRAMMAR_BYTE = 200
PROBE_TOKENS = 32  # allowed first tokens checked against the parser at compile time
MAX_COMPLETION_TOKENS = 1 << 20  # no bound: the shortest completion from the start, however long


class GrammarError(Exception):
    """A bad schema/grammar, or a grammar violation.

    ``status`` is a gRPC status name: "INVALID_ARGUMENT" (bad or unsupported
    input, naming the feature, and a constraint over the size or complexity
    limits: permanent, a retry gets the same answer), "RESOURCE_EXHAUSTED" (the
    compile timeout, whose compile goes on and is cached, and a parser limit hit
    while generating) or "INTERNAL" (a token the mask should have excluded); a
    final document that fails validation is ``SchemaNotEnforced``. ``str(e)`` says what was wrong.
    """

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class SchemaNotEnforced(GrammarError):
    """A generated ``json_schema`` document that fails the final validation (INVALID_ARGUMENT).

    The grammar accepts a superset of the schema (``service.grammar.schema.relax``: keywords
    llguidance cannot enforce are dropped), so a document can comply with the grammar and still
    break the schema. ``violation`` says where; ``approximations`` what the grammar left out.
    """

    def __init__(self, violation: gs.Violation, approximations: tuple[str, ...]) -> None:
        approx = ", ".join(approximations) or "none"
        super().__init__(
            "INVALID_ARGUMENT",
            _short(f"{violation}; the grammar could not enforce it (schema compiled with approximations: {approx})",
                   400),
        )
        self.violation = violation
        self.approximations = approximations


def _status_of(message: str) -> str:
    return "RESOURCE_EXHAUSTED" if any(w in message for w in _LIMIT_WORDS) else "INVALID_ARGUMENT"


def _short(message: str, limit: int = 400) -> str:
    message = message.strip()
    return message if len(message) <= limit else message[:limit] + "..."


def default_limits() -> llg.LLParserLimits:
    """llguidance parser limits: bounded compile work, per-token work and memory.

    NOTE: step limits bound every mask computation (~15 ms worst case at the
    quoted ~14k fuel/ms); a grammar that hits one stops (fail-closed) rather
    than stalling the engine step. ``verbose_errors`` is off so error messages
    returned to clients do not dump parser state.
    """
    return llg.LLParserLimits(
        max_items_in_row=2_000,
        initial_lexer_fuel=1_000_000,  # ~20 ms of regex construction at compile time
        step_lexer_fuel=200_000,
        step_max_items=50_000,
        max_lexer_states=50_000,  # ~100 MB worst case (1-2 kB per state)
        max_grammar_size=200_000,
        verbose_errors=False,
    )


@dataclass(frozen=True)
class CompiledGrammar:
    """An immutable compiled constraint, shared by every sequence that uses it."""

    kind: str  # "json_schema" | "regex" | "lark" | "gbnf"
    grammar: str  # llguidance grammar (JSON text) the matcher consumes
    schema: dict[str, Any] | None  # the client's JSON Schema (json_schema kind), for final validation
    approximations: tuple[str, ...]  # features compiled approximately, e.g. "oneOf->anyOf"
    _proto: Any = field(default=None, repr=False, compare=False)  # fresh LLMatcher, deep-copied per sequence
    _validator: Any = field(default=None, repr=False, compare=False)  # jsonschema validator
    # json_schema: tokens of the shortest completion from the start (the smallest max_tokens that
    # budget-aware completion can honour), None if the search found none; and the schema's
    # pattern examples that the completion search tries (service.grammar.examples).
    min_tokens: int | None = None
    hints: tuple[bytes, ...] = ()


class GrammarMatcher:
    """Per-sequence grammar state (engine thread only).

    For JSON output (a ``Completer`` given) it can also find the shortest
    completion of the document from its current state: consumed tokens are
    noted, and a JSON scan of their bytes catches up only when a completion is
    asked for, so matchers that never ask pay one list append per token.
    """

    __slots__ = ("_completer", "_hints", "_m", "_pending", "_scan")

    def __init__(
        self,
        matcher: llg.LLMatcher,
        completer: Completer | None = None,
        hints: tuple[bytes, ...] = (),
        scan: JsonScan | None = None,
    ) -> None:
        self._m = matcher
        self._completer = completer
        self._hints = hints
        self._scan = scan if scan is not None else JsonScan()
        self._pending: list[int] = []

    @property
    def ll_matcher(self) -> llg.LLMatcher:
        """The underlying llguidance matcher (for MaskBatch's parallel mask computation)."""
        return self._m

    def consume(self, token: int) -> None:
        """Advance by ``token``; raises GrammarError if the grammar does not allow it.

        Status "RESOURCE_EXHAUSTED" when a parser limit was hit, else "INTERNAL"
        (the mask should have excluded the token).
        """
        if self._completer is not None:
            self._pending.append(token)
        if not self._m.consume_token(token) or self._m.is_error():
            if self._status() == "RESOURCE_EXHAUSTED":
                raise GrammarError("RESOURCE_EXHAUSTED", f"grammar limit hit: {_short(self._m.get_error(), 200)}")
            # NOTE: llguidance's mask allowed a token its parser then refused. Seen when a
            # constraint needs bytes no token of this vocabulary produces (e.g. a raw control
            # character in a regex): a property of the constraint, not a server fault.
            raise GrammarError(
                "FAILED_PRECONDITION",
                "the constraint needs text this model's vocabulary cannot produce here "
                f"(token {token} was refused); simplify the constraint",
            )

    def _status(self) -> str:
        limit = _status_of(self._m.get_error()) == "RESOURCE_EXHAUSTED"
        return "RESOURCE_EXHAUSTED" if limit else "INTERNAL"

    def validate(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` the grammar would accept from here (nothing is consumed)."""
        return int(self._m.validate_tokens(tokens))

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (not consumed); [] if none or if the matcher is stopped.

        Only the prefix the parser accepts: llguidance may tokenize forced bytes into a
        token its parser refuses (bytes the vocabulary cannot produce).
        """
        if self._m.is_stopped():
            return []
        forced = list(self._m.compute_ff_tokens())
        return forced[: self._m.validate_tokens(forced)] if forced else forced

    def is_stopped(self) -> bool:
        """Nothing more may be generated (the grammar is complete, or the matcher failed)."""
        return bool(self._m.is_stopped())

    def is_accepting(self) -> bool:
        """The output so far is a complete match (EOS would be allowed)."""
        return bool(self._m.is_accepting())

    def fork(self) -> GrammarMatcher:
        """An independent copy of this state (to look a token ahead without committing it)."""
        self._catch_up()
        return GrammarMatcher(self._m.deep_copy(), self._completer, self._hints, self._scan.deep_copy())

    def completion(self, limit: int) -> list[int] | None:
        """Tokens of the shortest completion found from here (``service.grammar.completion``).

        None for non-JSON grammars, when the search finds none, or when it is
        longer than ``limit`` tokens. Nothing is consumed.
        """
        if self._completer is None or self._m.is_error():
            return None
        self._catch_up()
        return self._completer.complete(self._m, self._scan, limit, self._hints)

    def _catch_up(self) -> None:
        if self._completer is None or not self._pending:
            return
        decode = self._completer.tokenizer.decode_bytes
        for token in self._pending:
            self._scan.feed(decode([token]))  # records the keys: the completion never repeats one
        self._pending.clear()

    def error(self) -> GrammarError | None:
        """Why the matcher failed, or None.

        NOTE: a parser limit can also be hit while *computing a mask*; the matcher then
        fails and its mask row allows only end-of-generation tokens. Check this after
        ``MaskBatch.fill_and_apply`` to fail the request (RESOURCE_EXHAUSTED) instead of
        ending it as if the document were complete.
        """
        if not self._m.is_error():
            return None
        detail = _short(self._m.get_error(), 200)
        if "NoExtensionBias" in detail or not detail:
            # NOTE: llguidance found no token that continues the document from here (a
            # lexeme the tokenizer cannot finish, found only late): a property of this
            # schema and this particular output, not a server fault; a retry may succeed.
            return GrammarError(
                "FAILED_PRECONDITION",
                "the JSON Schema allows no continuation of the document generated so far "
                "(no token fits the grammar here); retry with another seed or simplify the schema",
            )
        return GrammarError(self._status(), f"grammar matcher failed: {detail}")


class GrammarCompiler:
    """Compiles constraints with bounded size and time, caching results by (kind, sha256(source))."""

    def __init__(
        self,
        ll_tokenizer: llg.LLTokenizer,
        *,
        max_source_bytes: int = 64_000,
        compile_timeout_s: float = 5.0,
        cache_size: int = 256,
        cache_bytes: int = 128 << 20,
        limits: llg.LLParserLimits | None = None,
        workers: int = 2,
    ) -> None:
        self._tok = ll_tokenizer
        self.max_source_bytes = max_source_bytes
        self.compile_timeout_s = compile_timeout_s
        self._limits = limits or default_limits()
        self.cache: GrammarCache[CompiledGrammar] = GrammarCache(cache_size, cache_bytes, _size_of)
        self.completer = Completer(ll_tokenizer)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grammar-compile")

    def start(self, kind: str, source: str) -> tuple[Future[CompiledGrammar], bool]:
        """(future of the compiled grammar, cache_hit): cheap, callable on the event loop.

        Raises GrammarError at once for an unknown kind or an oversized source.
        """
        if kind not in KINDS:
            raise GrammarError("INVALID_ARGUMENT", f"unknown constraint kind {kind!r}; use one of {KINDS}")
        data = source.encode("utf-8", "surrogatepass")
        if len(data) > self.max_source_bytes:
            raise GrammarError(  # NOTE: permanent: not RESOURCE_EXHAUSTED, which clients retry (issue #35)
                "INVALID_ARGUMENT",
                f"{kind} is {len(data)} bytes; the limit is {self.max_source_bytes} (--max-schema-bytes)",
            )
        key = (kind, hashlib.sha256(data).hexdigest())
        return self.cache.get_or_start(key, lambda: self._pool.submit(self._build, kind, source))

    def compile(self, kind: str, source: str) -> tuple[CompiledGrammar, bool, float]:
        """(compiled, cache_hit, compile_ms), waiting up to the compile timeout. Raises GrammarError."""
        t0 = time.perf_counter()
        fut, hit = self.start(kind, source)
        try:
            compiled = fut.result(timeout=self.compile_timeout_s)
        except FutureTimeout:
            raise GrammarError(
                "RESOURCE_EXHAUSTED", f"{kind} compile exceeded {self.compile_timeout_s:g} s"
            ) from None
        except GrammarError as exc:
            raise fresh(exc) from None
        return compiled, hit, (time.perf_counter() - t0) * 1000.0

    def matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        """A fresh matcher for one sequence (a cheap copy of the compiled prototype)."""
        completer = self.completer if compiled.kind == "json_schema" else None
        return GrammarMatcher(compiled._proto.deep_copy(), completer, compiled.hints)

    def close(self) -> None:
        """Stop the compile workers (pending compiles are cancelled)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- building (in a compile worker) ---------------------------------------------------------
    def _build(self, kind: str, source: str) -> CompiledGrammar:
        try:
            if kind == "json_schema":
                return self._build_json(source)
            if kind == "regex":
                grammar = llg.LLMatcher.grammar_from_regex(source)
            else:
                grammar = llg.LLMatcher.grammar_from_lark(source if kind == "lark" else _gbnf(source))
            proto = self._new_matcher(grammar)
            if proto.is_error():
                msg = proto.get_error()
                raise GrammarError("INVALID_ARGUMENT", f"{kind} grammar error: {_short(msg)}")
            _probe_start(proto, kind)
            return CompiledGrammar(kind, grammar, None, (), proto)
        except GrammarError:
            raise
        except RecursionError as exc:
            raise GrammarError("INVALID_ARGUMENT", f"{kind} is nested too deeply") from exc
        except Exception as exc:  # llguidance raises ValueError etc. for malformed input
            raise GrammarError("INVALID_ARGUMENT", f"{kind} error: {_short(str(exc))}") from exc

    def _new_matcher(self, grammar: str) -> llg.LLMatcher:
        return llg.LLMatcher(self._tok, grammar, log_level=0, limits=self._limits)

    def _build_json(self, source: str) -> CompiledGrammar:
        """Meta-validate, then compile, relaxing one unsupported feature per pass."""
        try:
            schema, cls = gs.parse_schema(source)
        except gs.SchemaProblem as exc:
            raise GrammarError("INVALID_ARGUMENT", str(exc)) from exc
        work, options = gs.prepare(schema), dict(JSON_OPTIONS, coerce_one_of=False)
        approx: list[str] = []
        for _ in range(MAX_RELAX_PASSES):
            grammar = llg.LLMatcher.grammar_from_json_schema(work, overrides=options)  # type: ignore[arg-type]
            proto = self._new_matcher(grammar)
            if not proto.is_error():
                _probe_start(proto, "json_schema")
                hints = schema_hints(gs.patterns(schema))
                shortest = self.completer.complete(proto, JsonScan(), MAX_COMPLETION_TOKENS, hints)
                validator = gs.make_validator(schema, cls)
                return CompiledGrammar(
                    "json_schema",
                    grammar,
                    schema,
                    tuple(approx),
                    proto,
                    validator,
                    None if shortest is None else len(shortest),
                    hints,
                )
            msg = proto.get_error()
            if _status_of(msg) == "RESOURCE_EXHAUSTED":  # a parser limit: permanent for this schema
                raise GrammarError("INVALID_ARGUMENT", f"JSON Schema too complex: {_short(msg)}")
            label = gs.relax(work, msg)
            if label is None or (label == gs.ONE_OF and options["coerce_one_of"]):
                raise GrammarError("INVALID_ARGUMENT", f"unsupported JSON Schema feature: {_short(msg)}")
            options["coerce_one_of"] |= label == gs.ONE_OF
            approx.append(label)
        raise GrammarError("INVALID_ARGUMENT", f"JSON Schema needs too many approximations: {approx}")


def _probe_start(proto: llg.LLMatcher, kind: str) -> None:
    """Refuse a constraint whose first step no token can take.

    NOTE: llguidance computes masks from its token trie and checks tokens with its
    parser; for bytes this vocabulary cannot produce (a raw control character,
    say) the two disagree: the mask allows tokens the parser refuses. Probing
    the first few allowed tokens at compile time turns that into INVALID_ARGUMENT
    instead of a failed generation.
    """
    m = proto.deep_copy()
    bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
    allowed = np.flatnonzero(bits)[:PROBE_TOKENS]
    if m.is_error():
        msg = m.get_error()
        raise GrammarError("INVALID_ARGUMENT", f"{kind} cannot start: {_short(msg)}")
    if len(allowed) and not any(m.validate_tokens([int(t)]) == 1 for t in allowed):
        raise GrammarError(
            "INVALID_ARGUMENT", f"{kind} needs text this model's vocabulary cannot produce (at its start)"
        )


def fresh(exc: GrammarError) -> GrammarError:
    """A new instance for one caller.

    NOTE: re-raising the cached instance from many threads would keep growing its
    shared traceback.
    """
    return GrammarError(exc.status, str(exc))


def _size_of(compiled: CompiledGrammar) -> int:
    return len(compiled.grammar) * BYTES_PER_GRAMMAR_BYTE


def _gbnf(source: str) -> str:
    try:
        return gbnf_to_lark(source)
    except Exception as exc:  # GbnfToLarkError and parser failures on malformed input
        raise GrammarError("INVALID_ARGUMENT", f"GBNF syntax error: {_short(str(exc))}") from exc


def validate_document(compiled: CompiledGrammar, text: str) -> None:
    """Final check of a generated ``json_schema`` document (no-op for other kinds).

    Parses ``text`` strictly (no duplicate keys, no NaN/Infinity) and validates it
    with jsonschema against the client's original schema, formats included.
    Raises SchemaNotEnforced naming the first violation's keyword and path.
    """
    if compiled.kind != "json_schema" or compiled._validator is None:
        return
    problem = gs.document_problem(compiled._validator, text)
    if problem is not None:
        raise SchemaNotEnforced(problem, compiled.approximations)
