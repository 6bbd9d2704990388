"""Word-order and word-choice facts of the semantic cache's guard (pure functions, no model).

Near-misses that keep almost every word and still ask something else:

- a *swap*: two words or phrases exchange places ("convert a string to an integer" / "an integer
  to a string", "Did Apple sue Samsung?" / "Did Samsung sue Apple?");
- a *reversed direction*: ``X to Y`` in one message and ``Y to X`` in the other, with other words
  changed around it ("from pounds to euros" / "to pounds from euros" is the same; "pounds to euros"
  / "euros to pounds" is not);
- *opposite ends*: the same word is where something goes in one message and where it comes from in
  the other ("shipping to Canada" / "shipping from Canada");
- a *negating prefix*: "safe" / "unsafe", "install" / "uninstall";
- an *added qualifier*: one message is the other plus a short span with a content word ("GDP" /
  "GDP per capita", "egg" / "duck egg"): it asks a narrower question;
- a *substitution*: the messages are equal but for one short span ("raw chicken" / "raw salmon").
  Whether that span is a synonym needs the embedding model, so ``substitution`` only finds it
  (``semantic.SemanticIndex`` judges it).
"""

from __future__ import annotations

from service.response_cache.lexicon import FUNCTION_WORDS, NEGATING_PREFIXES, norm

ARTICLES = frozenset(["a", "an", "the"])
# Words skipped when looking for the words a preposition relates.
FILLERS = ARTICLES | frozenset(
    norm(w)
    for w in [
        "my",
        "your",
        "his",
        "her",
        "its",
        "our",
        "their",
        "this",
        "that",
        "these",
        "those",
        "some",
        "any",
    ]
)
# Prepositions that give an order to the words around them; "into" and "toward(s)" mean "to".
DIRECTIONAL = {
    "to": "to",
    "into": "to",
    "toward": "to",  # "towards" too, once normalised
    "from": "from",
    "per": "per",
    "over": "over",
    "against": "against",
    "versu": "vs",  # "versus", normalised like the sequences (``lexicon.norm``)
    "vs": "vs",
}
# Exchanging the two sides of these changes nothing ("Python and Java" / "Java and Python").
SYMMETRIC = frozenset({("and",), ("or",), ("vs",), (norm("versus"),), ("with",)})  # normalised like sequences
SUBSTITUTION_MAX_WORDS = 3


def sequence(tokens: list[str]) -> tuple[str, ...]:
    """The message's words in order, normalised (``lexicon.norm``), without articles or punctuation."""
    return tuple(norm(t) for t in tokens if t[:1].isalnum() and t.lower() not in ARTICLES)


def _middles(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``a`` and ``b`` without their common prefix and common suffix."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    return a[i : len(a) - j], b[i : len(b) - j]


def swapped(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """True when ``b`` is ``a`` with two spans exchanged (X M Y -> Y M X), M non-empty and not a
    symmetric joiner ("and", "or")."""
    x_mid, y_mid = _middles(a, b)
    n = len(x_mid)
    if n < 2 or n != len(y_mid) or sorted(x_mid) != sorted(y_mid):
        return False
    for x in range(1, n):
        for y in range(1, n - x + 1):
            middle = x_mid[x : n - y]
            if (
                x_mid[:x] == y_mid[n - x :]
                and x_mid[n - y :] == y_mid[:y]
                and middle == y_mid[y : n - x]
                and middle  # adjacent spans trade places in ordinary rewording ("97 prime" / "prime 97")
                and middle not in SYMMETRIC
            ):
                return True
    return False


def _content(seq: tuple[str, ...], start: int, step: int) -> str | None:
    i = start
    while 0 <= i < len(seq):
        if seq[i] not in FILLERS and seq[i] not in DIRECTIONAL:
            return seq[i]
        if seq[i] in DIRECTIONAL:
            return None
        i += step
    return None


def directions(seq: tuple[str, ...]) -> frozenset[tuple[str, str, str]]:
    """(word before, preposition, word after) around each directional preposition."""
    out = set()
    for i, word in enumerate(seq):
        if word in DIRECTIONAL:
            left, right = _content(seq, i - 1, -1), _content(seq, i + 1, 1)
            if left and right and left != right:
                out.add((left, DIRECTIONAL[word], right))
    return frozenset(out)


def reversed_direction(a: frozenset[tuple[str, str, str]], b: frozenset[tuple[str, str, str]]) -> bool:
    """One message relates X to Y, the other Y to X with the same preposition."""
    return any((y, p, x) in b for x, p, y in a)


def ends(seq: tuple[str, ...]) -> frozenset[tuple[str, str]]:
    """("to", w) for the word after to/into/toward(s), ("from", w) for the word after from."""
    out = set()
    for i, word in enumerate(seq):
        if DIRECTIONAL.get(word) in ("to", "from") and (right := _content(seq, i + 1, 1)):
            out.add((DIRECTIONAL[word], right))
    return frozenset(out)


def opposite_ends(a: frozenset[tuple[str, str]], b: frozenset[tuple[str, str]]) -> bool:
    """A word is a destination in one message and an origin in the other, and not both in either."""
    flip = {"to": "from", "from": "to"}
    return any((flip[p], w) in b and (p, w) not in b and (flip[p], w) not in a for p, w in a)


def negated_by_prefix(a: frozenset[str], b: frozenset[str]) -> bool:
    """A word of one set appears in the other only with a negating prefix ("safe" / "unsafe")."""
    for one, other in ((a, b), (b, a)):
        for word in one:
            if len(word) >= 4 and any(p + word in other and p + word not in one for p in NEGATING_PREFIXES):
                return True
    return False


def substitution(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, str] | None:
    """The differing spans when ``a`` and ``b`` are equal but for one short span each (both non-empty,
    at most SUBSTITUTION_MAX_WORDS words), else None."""
    x_mid, y_mid = _middles(a, b)
    if not x_mid or not y_mid or max(len(x_mid), len(y_mid)) > SUBSTITUTION_MAX_WORDS:
        return None
    return " ".join(x_mid), " ".join(y_mid)


def added_qualifier(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One sequence is the other plus one span of at most SUBSTITUTION_MAX_WORDS words, at least one of
    them a content word (not ``lexicon.FUNCTION_WORDS``)."""
    x_mid, y_mid = _middles(a, b)
    extra = x_mid or y_mid
    return (
        not (x_mid and y_mid)
        and 0 < len(extra) <= SUBSTITUTION_MAX_WORDS
        and any(w not in FUNCTION_WORDS for w in extra)
    )


def content_substitution(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, str] | None:
    """``substitution`` when both spans hold content words and do not share a stem (their first
    four letters: "painted" / "painter"); the spans' content words, else None."""
    sub = substitution(a, b)
    if sub is None:
        return None
    x = " ".join(w for w in sub[0].split() if w not in FUNCTION_WORDS)
    y = " ".join(w for w in sub[1].split() if w not in FUNCTION_WORDS)
    if not x or not y or x[:4] == y[:4]:
        return None
    return x, y
