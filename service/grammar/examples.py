"""Short example strings for a schema's ``pattern``s: hints for the completion search.

``service.grammar.completion`` writes string content byte by byte; a pattern
that needs a particular word (an unanchored ``rocket_document``, a
``\\d{4}-\\d{2}`` inside free text) is beyond a byte-by-byte search. These
examples are tried there as whole strings; the grammar still judges every
byte, so a wrong or unsupported example only costs one dry run.

The example of a pattern is built from Python's own regex parser (the
common subset of ECMA-262 and Rust regex syntax): literals as they are,
classes by a representative, repeats at their minimum, the shortest
alternative, anchors and look-arounds as nothing.
"""

from __future__ import annotations

import json
import re
import re._parser as sre
from collections.abc import Callable, Iterable
from typing import Any

MAX_HINTS = 32
MAX_HINT_BYTES = 512
_DIGIT, _WORD, _SPACE = "1", "a", " "
_CATEGORY = {
    sre.CATEGORY_DIGIT: _DIGIT,
    sre.CATEGORY_NOT_DIGIT: "a",
    sre.CATEGORY_WORD: _WORD,
    sre.CATEGORY_NOT_WORD: "-",
    sre.CATEGORY_SPACE: _SPACE,
    sre.CATEGORY_NOT_SPACE: "a",
}
_TRY_CHARS = "a1A_-. x"


class _NoExample(Exception):
    pass


def pattern_example(pattern: str) -> str | None:
    """A short string matching ``pattern`` (searched, so anchors do not matter), or None."""
    try:
        text = _seq(sre.parse(pattern))
    except (_NoExample, re.error, RecursionError, OverflowError, ValueError, TypeError):
        return None
    try:
        return text if re.search(pattern, text) else None
    except (re.error, RecursionError):
        return None


def _seq(items: Iterable[tuple[Any, Any]]) -> str:
    return "".join(_node(op, av) for op, av in items)


def _node(op: Any, av: Any) -> str:
    handler = _HANDLERS.get(op)
    if handler is None:
        raise _NoExample(str(op))
    return handler(av)


def _class(items: list[tuple[Any, Any]]) -> str:
    if items and items[0][0] is sre.NEGATE:
        banned = items[1:]
        for c in _TRY_CHARS:
            if not any(_in_item(op, av, c) for op, av in banned):
                return c
        raise _NoExample("negated class")
    op, av = items[0]
    if op is sre.LITERAL:
        return chr(av)
    if op is sre.RANGE:
        lo, hi = av
        return chr(lo) if not (lo <= ord(_DIGIT) <= hi) else _DIGIT
    if op is sre.CATEGORY:
        return _CATEGORY[av]
    raise _NoExample(str(op))


def _in_item(op: Any, av: Any, c: str) -> bool:
    if op is sre.LITERAL:
        return ord(c) == av
    if op is sre.RANGE:
        return av[0] <= ord(c) <= av[1]
    if op is sre.CATEGORY:
        return re.fullmatch(_CATEGORY_RE.get(av, "."), c) is not None
    return True


_CATEGORY_RE = {
    sre.CATEGORY_DIGIT: r"\d",
    sre.CATEGORY_NOT_DIGIT: r"\D",
    sre.CATEGORY_WORD: r"\w",
    sre.CATEGORY_NOT_WORD: r"\W",
    sre.CATEGORY_SPACE: r"\s",
    sre.CATEGORY_NOT_SPACE: r"\S",
}


def _repeat(av: Any) -> str:
    low, _high, sub = av
    return _seq(sub) * int(low)


def _branch(av: Any) -> str:
    return min((_seq(alt) for alt in av[1]), key=len)


def _not_literal(av: Any) -> str:
    return "a" if av != ord("a") else "b"


_HANDLERS: dict[Any, Callable[[Any], str]] = {
    sre.LITERAL: chr,
    sre.NOT_LITERAL: _not_literal,
    sre.ANY: lambda _av: "a",
    sre.IN: _class,
    sre.MAX_REPEAT: _repeat,
    sre.MIN_REPEAT: _repeat,
    sre.POSSESSIVE_REPEAT: _repeat,
    sre.SUBPATTERN: lambda av: _seq(av[-1]),
    sre.ATOMIC_GROUP: _seq,
    sre.BRANCH: _branch,
    sre.AT: lambda _av: "",
    sre.ASSERT: lambda _av: "",
    sre.ASSERT_NOT: lambda _av: "",
    sre.CATEGORY: lambda av: _CATEGORY[av],
}


def schema_hints(patterns: Iterable[str]) -> tuple[bytes, ...]:
    """Distinct JSON-string-encoded examples of ``patterns`` (at most MAX_HINTS, each short)."""
    out: list[bytes] = []
    for p in patterns:
        example = pattern_example(p)
        if example is None:
            continue
        data = _json_content(example)
        if data and len(data) <= MAX_HINT_BYTES and data not in out:
            out.append(data)
        if len(out) >= MAX_HINTS:
            break
    return tuple(out)


def _json_content(text: str) -> bytes:
    """``text`` as the content of a JSON string (escaped as json.dumps does, without the quotes)."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")
