"""A tiny vocabulary for grammar tests: built from a ``tests.support.tiny_vocab.Family`` (never committed), its
llguidance tokenizer, the markup of some markers in it, and the few operations the chat grammar tests share."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llguidance as llg

from service.chat.markup import Markup, bind
from service.model.runner import Vocab
from tests.support.tiny_vocab import Family, build


class GrammarVocab:
    """``family``'s tiny vocabulary written to ``path``, with ``markers`` bound in it (``markup``)."""

    def __init__(self, family: Family, path: Path, markers: Sequence[str]) -> None:
        self.vocab = Vocab.load(build(path, family=family))
        self.ll = self.vocab.ll_tokenizer()
        self.markup: Markup = bind(list(markers), lambda t: self.vocab.tokenize(t, False, True),
                                   self.ll.is_special_token,
                                   lambda t: self.vocab.piece(t, True).decode("utf-8", "replace"))

    def ids(self, text: str) -> list[int]:
        """``text``'s tokens, its special tokens' texts as those tokens."""
        return self.vocab.tokenize(text, add_special=False, parse_special=True)

    def matcher(self, source: str) -> Any:
        """A matcher of the Lark grammar ``source`` (asserted to compile)."""
        m = llg.LLMatcher(self.ll, llg.LLMatcher.grammar_from_lark(source))
        assert not m.is_error(), m.get_error()
        return m

    def accepts(self, source: str, text: str) -> bool:
        """The grammar takes ``text``'s tokens whole and is then in an accepting state."""
        ids, m = self.ids(text), self.matcher(source)
        return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()
