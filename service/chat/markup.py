"""A family's markers in one vocabulary: which parts are special tokens, for grammars and for the text.

llguidance's tokenizer (``lltokenizer_from_vocab``) marks the vocabulary's control
tokens, and its user-defined tokens that look like ``<...>``, as special: a grammar
reaches them only as ``<[id]>``, never through a string literal, and free text
(``/(?s:.*)/``) never contains one. A family's markers (``<tool_call>``,
``[TOOL_CALLS]``, ``<｜tool▁sep｜>``...) are special tokens in their own models'
vocabularies and plain text in others, so the grammar of a marker depends on the
vocabulary: ``Markup`` says, for each marker, which of its parts is which.

Control tokens render as nothing in the engine's text (``Vocab.token_bytes``);
``shown`` lists the special tokens of the markers by id and text, so that the text
of a request that may call tools shows them and its parser can read the calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


def literal(text: str) -> str:
    """A Lark string literal of ``text``."""
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True)
class Markup:
    """Marker texts that are special tokens (text -> token id) in one vocabulary; see the module doc."""

    specials: Mapping[str, int] = field(default_factory=dict)

    def parts(self, text: str) -> list[str | int]:
        """``text`` split into runs of plain text and special tokens (ids), longest special first."""
        if not self.specials or not text:
            return [text] if text else []
        pattern = "|".join(re.escape(s) for s in sorted(self.specials, key=len, reverse=True))
        out: list[str | int] = []
        last = 0
        for m in re.finditer(pattern, text):
            if m.start() > last:
                out.append(text[last : m.start()])
            out.append(self.specials[m.group()])
            last = m.end()
        if last < len(text):
            out.append(text[last:])
        return out

    def lark(self, text: str) -> str:
        """``text`` as a sequence of Lark items ("" for empty text)."""
        return " ".join(f"<[{p}]>" if isinstance(p, int) else literal(p) for p in self.parts(text))

    def is_special(self, text: str) -> bool:
        """``text`` is exactly one special token."""
        return text in self.specials

    def shown(self) -> dict[int, bytes]:
        """The special tokens of the markers by id, with the text the parser must see for each."""
        return {token: text.encode() for text, token in self.specials.items()}


def bind(markers: Iterable[str], tokenize: Callable[[str], list[int]], is_special: Callable[[int], bool],
         text_of: Callable[[int], str]) -> Markup:
    """The markup of ``markers`` in one vocabulary: ``tokenize`` (special tokens parsed), llguidance's
    ``is_special`` and each token's text."""
    specials: dict[str, int] = {}
    for marker in markers:
        for token in tokenize(marker) if marker else []:
            text = text_of(token)
            if is_special(token) and text and text in marker:
                specials.setdefault(text, token)
    return Markup(specials)
