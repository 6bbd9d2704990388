"""Where llama.cpp's user-defined tokens occur in text, and cuts of text that keep its token ids.

llama.cpp matches a user-defined token's text (Qwen's ``<tool_call>``, gpt-oss's
retyped harmony markers) in any text it tokenizes, special parsing or not, and its
search for them is quadratic in how many occur in one call: it splits the text
into a linked list of fragments and walks that list from its head for every match
(80,000 ``<tool_call>`` in one call: 9 s). ``UserTokens.batches`` cuts text into
pieces of at most ``most`` occurrences each, which together get exactly the ids of
the one call.

Why a cut keeps the ids: llama.cpp takes the tokens longest first and, within
each fragment of text not yet matched, each token's occurrences left to right
without overlap, then tokenizes the fragments between the matches apart. A cut
goes only before an *isolated* occurrence: one that no other occurrence of any
user-defined token overlaps (nor one starting at the same place, which is shorter
and comes later). llama.cpp matches an isolated occurrence whatever else the text
holds, so the cut falls where it splits the text anyway, and no match crosses it,
so both sides are matched as they were. An occurrence of a token that strips the
whitespace before it (``lstrip``) is never a cut: the left side would keep it.

NOTE: text in which the occurrences overlap each other for long stretches (a
vocabulary's user-defined runs of spaces or newlines, in a long run of them) has
no place to cut there; a batch then holds more than ``most``. Such tokens are
matched longest first, so they occur at most once per few characters. The
user-defined tokens of real chat models (``<tool_call>``, ``<think>``, ``<|...|>``)
cannot overlap: ``<`` starts them and occurs nowhere else in them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import islice

from service.model.control_tokens import cut_at, trie
from service.model.runner import SpecialText


class UserTokens:
    """Finds the user-defined tokens of one vocabulary (``Vocab.user_defined()``) in text in linear
    time (one regular expression shaped as a trie of their texts); see the module doc."""

    def __init__(self, tokens: Sequence[SpecialText]) -> None:
        texts = {t.text for t in tokens}
        self._no_cut = frozenset(t.text for t in tokens if t.lstrip)
        words = trie(texts) if texts else "(?!)"
        self._any = re.compile(words)
        self._at = re.compile(f"(?=({words}))")  # NOTE: at every position, the longest one starting there

    def count(self, text: str, cap: int) -> int:
        """How many places in ``text`` an occurrence starts at (overlapping ones too), or ``cap`` if that
        many or more: at least as many as llama.cpp matches there."""
        if self._any.search(text) is None:
            return 0
        return sum(1 for _ in islice(self._at.finditer(text), cap))

    def batches(self, text: str, most: int) -> list[str]:
        """``text`` cut before isolated occurrences (see the module doc) so that no batch holds more
        than ``most`` where the occurrences leave a place to cut; the batches join to ``text``, and
        llama.cpp gives their ids, one call each, joined, as it gives ``text``'s; linear in the text."""
        if self._any.search(text) is None:
            return [text]
        spans = [(m.start(), m.end(1)) for m in self._at.finditer(text)]
        cuts: list[int] = []
        held, reach = 0, 0  # occurrences in the current batch; where the furthest one so far ends
        for i, (start, end) in enumerate(spans):
            isolated = reach <= start and (i + 1 == len(spans) or spans[i + 1][0] >= end)
            if held >= most and isolated and text[start:end] not in self._no_cut:
                cuts.append(start)
                held = 0
            held += 1
            reach = max(reach, end)
        return cut_at(text, cuts)
