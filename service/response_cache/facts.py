"""Facts of a message that a near-miss changes while its embedding barely moves.

A semantic hit (``semantic.SemanticIndex``) needs ``same_facts``: the same
numbers, the same negation, the same units, and every capitalised name of one
message present in the other, no contrasting words (``lexicon.CONTRASTS``) and no
swapped or reversed roles (``relations``). The rules are deliberately simple and err on the
side of a miss (a paraphrase that drops a unit or spells a name differently is
not reused); bench scenario K measures both sides on bench/data/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.response_cache.lexicon import (
    AMBIGUOUS_UNITS,
    CONTRASTS,
    NEGATIONS,
    NOT_NAMES,
    NOT_SUPERLATIVES,
    NUMBER_WORDS,
    TIME_NOUNS,
    TIME_OPENERS,
    TIME_UNITS,
    UNITS,
    WH,
    norm,
)
from service.response_cache.relations import (
    added_qualifier,
    directions,
    ends,
    negated_by_prefix,
    opposite_ends,
    reversed_direction,
    sequence,
    swapped,
)

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z'’-]*|\d+(?:[.,]\d+)*|[%°$€£¥&]|[.!?;:]")


@dataclass(frozen=True)
class Facts:
    numbers: tuple[str, ...]  # in order: "2 to the power of 10" is not "10 to the power of 2"
    negated: bool
    units: frozenset[str]
    names: frozenset[str]  # capitalised words not opening a sentence, normalised
    words: frozenset[str]  # every word, normalised (names of the other message are looked up here)
    bound: frozenset[tuple[str, str]] = frozenset()  # (number, the unit right after it)
    asks: str = ""  # who / when / where / why, when the question says
    superlatives: frozenset[str] = frozenset()
    sequence: tuple[str, ...] = ()  # the words in order, without articles (``relations.sequence``)
    directions: frozenset[tuple[str, str, str]] = frozenset()  # (x, "to", y) ...


def _unit(prev: str, word: str) -> str | None:
    lw = word.lower()
    if lw not in UNITS:
        return None
    after_number = bool(_NUMBER.fullmatch(prev)) or prev in NUMBER_WORDS
    if lw in AMBIGUOUS_UNITS and not after_number:
        return None
    unit = UNITS[lw]
    if unit in TIME_UNITS and not (after_number or prev in TIME_OPENERS):
        return None
    return unit


def _ordinal_second(prev: str, low: str) -> bool:
    """ "second" the ordinal ("the second tallest"), not the unit ("30 seconds", "a second")."""
    return low == "second" and not (_NUMBER.fullmatch(prev) or prev in NUMBER_WORDS or prev in TIME_OPENERS)


def _bound(tokens: list[str]) -> frozenset[tuple[str, str]]:
    """(number, unit) where a unit follows a number within two tokens ("100 degrees Celsius")."""
    out = set()
    for i, tok in enumerate(tokens):
        if _NUMBER.fullmatch(tok):
            for nxt in tokens[i + 1 : i + 3]:
                if (unit := _unit(tok, nxt)) is not None or (unit := UNITS.get(nxt.lower())) is not None:
                    out.add((tok.replace(",", ""), unit))
                    break
    return frozenset(out)


def _asks(lower: list[str]) -> str:
    for i, w in enumerate(lower):
        if w in WH:
            return WH[w]
        if w in ("what", "which") and i + 1 < len(lower) and lower[i + 1] in TIME_NOUNS:
            return "time"
    return ""


def facts(text: str) -> Facts:
    """The facts of ``text`` (see the module docstring)."""
    tokens = _TOKEN.findall(text)
    numbers: list[str] = []
    names, words, units = set(), set(), set()
    negated = False
    prev = "."
    for tok in tokens:
        low = tok.lower().replace("’", "'")
        if low in NUMBER_WORDS or _NUMBER.fullmatch(tok) or _ordinal_second(prev.lower(), low):
            numbers.append(low.replace(",", ""))
        negated = negated or low in NEGATIONS or low.endswith("n't")
        if (unit := _unit(prev.lower(), tok)) is not None:
            units.add(unit)
        if tok[:1].isalpha():
            words.add(norm(tok))
            if tok[:1].isupper() and prev not in ".!?;:" and low not in NOT_NAMES:
                names.add(norm(tok))
        prev = tok
    lower = [t.lower() for t in tokens]
    seq = sequence(tokens)
    superlatives = {w for w in lower if len(w) > 4 and w.endswith("est") and w not in NOT_SUPERLATIVES}
    return Facts(
        tuple(numbers),
        negated,
        frozenset(units),
        frozenset(names),
        frozenset(words),
        _bound(tokens),
        _asks(lower),
        frozenset(superlatives | ({"best"} & set(lower))),
        seq,
        directions(seq),
    )


def _contrasting(a: Facts, b: Facts) -> bool:
    """A word class of a contrast group in one message, only another class of it in the other."""
    for group in CONTRASTS:
        in_a = {group[w] for w in a.words if w in group}
        in_b = {group[w] for w in b.words if w in group}
        if in_a and in_b and not in_a & in_b:
            return True
    return False


def same_facts(a: Facts, b: Facts) -> bool:
    """Equal numbers, negation, units, number-unit pairs and superlatives; each message's names appear
    in the other; the same kind of question (who/when/where/why) when both say; no contrasting words,
    no word negated by a prefix in the other, no two words or phrases swapped, no reversed direction or opposite ends, no qualifier added."""
    return (
        a.numbers == b.numbers
        and a.negated == b.negated
        and a.units == b.units
        and a.bound == b.bound
        and a.superlatives == b.superlatives
        and a.names <= b.words
        and b.names <= a.words
        and (not a.asks or not b.asks or a.asks == b.asks)
        and not _contrasting(a, b)
        and not negated_by_prefix(a.words, b.words)
        and not swapped(a.sequence, b.sequence)
        and not reversed_direction(a.directions, b.directions)
        and not opposite_ends(ends(a.sequence), ends(b.sequence))
        and not added_qualifier(a.sequence, b.sequence)
    )
