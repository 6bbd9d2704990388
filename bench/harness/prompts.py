"""Seeded synthetic prompts of a chosen length in model tokens.

Prompts are random sequences of common English words, so nothing is shared
between two prompts except by design (the first token is random too, so two
"unique" prompts never share a 16-token KV block). Lengths are exact in tokens
of the benchmark model: the text is cut at a token boundary with the model's
own vocabulary (``Vocab.load`` reads only the tokenizer).
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path

_WORD_TEXT = """
time person year way day thing man world life hand part child eye woman place work week case point
government company number group problem fact be have do say get make go know take see come think
look want give use find tell ask seem feel try leave call good new first last long great little own
other old right big high different small large next early young important few public bad same able
to of in for on with at by from up about into over after river mountain garden kitchen window letter
market engine library theory music forest planet ocean bridge castle village winter summer autumn
spring morning evening journey story question answer reason pattern signal network memory process
system language history science nature animal bird fish tree flower stone metal glass paper light
shadow color sound silence voice dream idea plan method result effect cause change growth energy
power force motion speed distance weight measure value price cost trade money bank road street city
country border island coast
"""
WORDS = tuple(_WORD_TEXT.split())


@lru_cache(maxsize=2)
def _vocab(model: str) -> object:
    from service.model.runner import Vocab

    return Vocab.load(model)


class PromptMaker:
    """Makes prompts of exactly ``n`` tokens (BOS included) for one model, from one seed."""

    def __init__(self, model: str | Path, seed: int) -> None:
        self.vocab = _vocab(str(model))
        self.rng = random.Random(seed)

    def words(self, n_words: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n_words))

    def tokens(self, text: str) -> int:
        """Tokens the server counts for a raw prompt (BOS included)."""
        return len(self.vocab.tokenize(text, add_special=True, parse_special=False))  # type: ignore[attr-defined]

    def text(self, n_tokens: int) -> str:
        """Random words cut to ``n_tokens`` prompt tokens (BOS included)."""
        return self.cut(self.words(n_tokens + 8), n_tokens)

    def cut(self, text: str, n_tokens: int) -> str:
        """``text`` shortened to at most ``n_tokens`` prompt tokens, at a word boundary."""
        words = text.split(" ")
        while len(words) > 1 and self.tokens(" ".join(words)) > n_tokens:
            over = self.tokens(" ".join(words)) - n_tokens
            words = words[: max(1, len(words) - max(1, over // 2))]
        return " ".join(words)

    def unique(self, count: int, lo: int, hi: int) -> list[str]:
        """``count`` distinct prompts of ``lo..hi`` tokens each."""
        return [self.text(self.rng.randint(lo, hi)) for _ in range(count)]
