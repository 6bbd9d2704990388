"""Where control tokens are in a prompt: found in linear time, and never in caller text.

llama.cpp turns the text of a control token (``<|im_start|>``, ``<|eot_id|>``,
``[INST]``...) into that token when it tokenizes with ``parse_special``, wherever
the text occurs. A rendered chat mixes the template's own markers with text
callers wrote, so it must not be tokenized that way (a message could forge
turns), and llama.cpp's own search for them is quadratic in their number (80,000
markers in 960 KB: 40 s). ``ControlTokens`` does both jobs itself:

* ``escape(text)`` marks every place in caller text where a control token's
  text starts, with a private-use character (``BREAK``) the finder does not
  match after; the caller's own ``BREAK`` characters are escaped as
  ``BREAK ESC``. Template filters that trim, strip, split or slice the content
  keep the marks, since they are ordinary, non-space characters.
* ``split(text)`` finds the control tokens that no mark precedes (one regular
  expression built as a trie of the token texts: linear in the text), drops the
  marks from the text between them (``reveal``) and applies llama.cpp's
  lstrip/rstrip rules, giving the runs of text to tokenize as plain text and the
  control tokens between them, as llama.cpp's partition does.
* ``pieces(text)`` cuts text one character into every occurrence of a control
  token that llama.cpp matches in any text (``SpecialText.in_any_text``:
  gpt-oss's harmony markers), so that no piece holds one whole.

The two characters are chosen per vocabulary and template: private-use code
points that occur in no token text and nowhere in ``avoid`` (the template).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import pairwise

from service.model.runner import SpecialText

Part = str | SpecialText  # a run of plain text, or a control token
Trie = dict[str, "Trie"]  # next character -> subtree; "" marks the end of a word
# llama.cpp strips what C's isspace() matches (in the "C" locale) around lstrip/rstrip tokens.
C_SPACE = " \t\n\v\f\r"
_PRIVATE_USE = range(0xE000, 0xF900)


def trie(words: Iterable[str]) -> str:
    """A regular expression matching any of ``words``, longest first, without backtracking between them."""
    root: Trie = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: Trie) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        group = alts[0] if len(alts) == 1 and "" not in node else "(?:" + "|".join(alts) + ")"
        return group + "?" if "" in node else group  # NOTE: greedy: the longer token wins

    return emit(root)


def free_chars(n: int, avoid: str) -> list[str]:
    """``n`` private-use characters that do not occur in ``avoid``."""
    used = set(avoid)
    out = [c for c in map(chr, _PRIVATE_USE) if c not in used][:n]
    if len(out) < n:
        raise ValueError("no free private-use characters to mark caller text with")
    return out


def cut_at(text: str, cuts: list[int]) -> list[str]:
    """``text`` cut at ``cuts`` (ascending, inside the text)."""
    return [text[a:b] for a, b in pairwise([0, *cuts, len(text)])] if cuts else [text]


class ControlTokens:
    """Finds the control tokens of one vocabulary (``Vocab.special_texts()``) in text; see the module doc.

    ``marks``: the (BREAK, ESC) characters; both must occur in no token text.
    """

    def __init__(self, specials: Sequence[SpecialText], marks: tuple[str, str]) -> None:
        by_text: dict[str, SpecialText] = {}
        for s in sorted(specials, key=lambda s: s.id):
            by_text.setdefault(s.text, s)  # NOTE: two tokens with one text: the lower id, deterministically
        self.by_text = by_text
        self.brk, self.esc = marks
        if any(c in t for t in by_text for c in marks):
            raise ValueError("a mark character occurs in a token text")
        words = trie(by_text) if by_text else "(?!)"
        b = re.escape(self.brk)
        self._find = re.compile(f"(?<!{b}){words}")
        self._find_all = re.compile(words)
        self._mark = re.compile(f"({b})|(?={words})")
        # NOTE: a one-character token cannot be cut inside (none is retyped); its occurrences are left whole.
        anywhere = [t for t, s in by_text.items() if s.in_any_text and len(t) > 1]
        self._anywhere = re.compile(f"(?={trie(anywhere)})") if anywhere else None

    def escape(self, text: str) -> str:
        """Caller text in which ``split`` finds no control token (``reveal`` gives ``text`` back)."""
        return self._mark.sub(lambda m: self.brk + self.esc if m.group(1) else self.brk, text)

    def holds_control(self, text: str) -> bool:
        """Some control token's text occurs in ``text``."""
        return self._find_all.search(text) is not None

    def pieces(self, text: str) -> list[str]:
        """``text`` cut one character into every occurrence of an ``in_any_text`` token's text (overlapping
        ones too): no piece holds one whole, and the pieces join to ``text``; linear in the text."""
        return cut_at(text, [start + 1 for start in self._starts(text)])

    def _starts(self, text: str) -> list[int]:
        """Where an ``in_any_text`` token's text starts in ``text``, in order."""
        return [] if self._anywhere is None else [m.start() for m in self._anywhere.finditer(text)]

    def reveal(self, text: str) -> str:
        """``text`` without the marks ``escape`` added: BREAK ESC -> BREAK, a lone BREAK -> nothing."""
        pair = self.brk + self.esc
        if self.brk not in text:
            return text
        return self.brk.join(piece.replace(self.brk, "") for piece in text.split(pair))

    def split(self, text: str, marked: bool = True) -> list[Part]:
        """The control tokens of ``text`` and the runs of plain text between them.

        ``marked``: ``text`` holds escaped caller text: a token a mark precedes is text, and
        runs are revealed; False: every token's text is the token, and no character is a mark.
        Runs are never empty; a token with ``lstrip``/``rstrip`` takes the whitespace
        before/after it, as llama.cpp's partition does.
        """
        parts: list[Part] = []
        start, strip_left = 0, False
        for m in (self._find if marked else self._find_all).finditer(text):
            token = self.by_text[m.group()]
            self._run(parts, text[start : m.start()], marked, strip_left, token.lstrip)
            parts.append(token)
            start, strip_left = m.end(), token.rstrip
        self._run(parts, text[start:], marked, strip_left, False)
        return parts

    def _run(self, parts: list[Part], raw: str, marked: bool, strip_left: bool, strip_right: bool) -> None:
        run = self.reveal(raw) if marked else raw
        if strip_left:
            run = run.lstrip(C_SPACE)
        if strip_right:
            run = run.rstrip(C_SPACE)
        if run:
            parts.append(run)
