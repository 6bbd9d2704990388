"""Facts of a message that a near-miss changes while its embedding barely moves.

A semantic hit (``semantic.SemanticIndex``) needs ``same_facts``: the same
numbers, the same negation, the same units, and every capitalised name of one
message present in the other. The rules are deliberately simple and err on the
side of a miss (a paraphrase that drops a unit or spells a name differently is
not reused); bench scenario K measures both sides on bench/data/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z'’]*|\d+(?:[.,]\d+)*|[%°$€£¥]|[.!?;:]")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# NOTE: "one" and "second" are left out: "a cup" / "one cup" and "seconds" the unit are paraphrase noise.
NUMBER_WORDS = _words(
    "zero two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion trillion half quarter dozen first third fourth fifth once twice double triple"
)
NEGATIONS = _words(
    "not no never none nobody nothing neither nor without cannot isn't aren't wasn't weren't don't doesn't "
    "didn't won't wouldn't can't couldn't shouldn't hasn't haven't hadn't mustn't"
)
UNITS = {  # synonym -> canonical
    **dict.fromkeys(["km", "kilometer", "kilometers", "kilometre", "kilometres"], "km"),
    **dict.fromkeys(["mi", "mile", "miles"], "mile"),
    **dict.fromkeys(["m", "meter", "meters", "metre", "metres"], "m"),
    **dict.fromkeys(["cm", "centimeter", "centimeters"], "cm"),
    **dict.fromkeys(["mm", "millimeter", "millimeters"], "mm"),
    **dict.fromkeys(["ft", "foot", "feet"], "ft"),
    **dict.fromkeys(["in", "inch", "inches"], "inch"),
    **dict.fromkeys(["yd", "yard", "yards"], "yard"),
    **dict.fromkeys(["kg", "kilogram", "kilograms", "kilo", "kilos"], "kg"),
    **dict.fromkeys(["g", "gram", "grams"], "g"),
    **dict.fromkeys(["lb", "lbs", "pound", "pounds"], "lb"),
    **dict.fromkeys(["oz", "ounce", "ounces"], "oz"),
    **dict.fromkeys(["l", "liter", "liters", "litre", "litres"], "l"),
    **dict.fromkeys(["ml", "milliliter", "milliliters"], "ml"),
    **dict.fromkeys(["gal", "gallon", "gallons"], "gal"),
    **dict.fromkeys(["c", "celsius", "centigrade"], "celsius"),
    **dict.fromkeys(["f", "fahrenheit"], "fahrenheit"),
    **dict.fromkeys(["kelvin"], "kelvin"),
    **dict.fromkeys(["s", "sec", "second", "seconds"], "s"),
    **dict.fromkeys(["min", "minute", "minutes"], "min"),
    **dict.fromkeys(["h", "hr", "hour", "hours"], "h"),
    **dict.fromkeys(["day", "days"], "day"),
    **dict.fromkeys(["week", "weeks"], "week"),
    **dict.fromkeys(["month", "months"], "month"),
    **dict.fromkeys(["year", "years"], "year"),
    **dict.fromkeys(["mph"], "mph"),
    **dict.fromkeys(["kph", "kmh"], "kph"),
    **dict.fromkeys(["$", "usd", "dollar", "dollars"], "usd"),
    **dict.fromkeys(["€", "eur", "euro", "euros"], "eur"),
    **dict.fromkeys(["£", "gbp", "sterling"], "gbp"),
    **dict.fromkeys(["¥", "yen", "jpy"], "jpy"),
    **dict.fromkeys(["%", "percent", "percentage"], "percent"),
    **dict.fromkeys(["kb", "kilobyte", "kilobytes"], "kb"),
    **dict.fromkeys(["mb", "megabyte", "megabytes"], "mb"),
    **dict.fromkeys(["gb", "gigabyte", "gigabytes"], "gb"),
    **dict.fromkeys(["tb", "terabyte", "terabytes"], "tb"),
    **dict.fromkeys(["byte", "bytes"], "byte"),
    **dict.fromkeys(["w", "watt", "watts"], "w"),
    **dict.fromkeys(["kw", "kilowatt", "kilowatts"], "kw"),
    **dict.fromkeys(["kwh"], "kwh"),
    **dict.fromkeys(["v", "volt", "volts"], "v"),
    **dict.fromkeys(["acre", "acres"], "acre"),
    **dict.fromkeys(["hectare", "hectares", "ha"], "ha"),
    **dict.fromkeys(["cup", "cups"], "cup"),
    **dict.fromkeys(["tablespoon", "tablespoons", "tbsp"], "tbsp"),
    **dict.fromkeys(["teaspoon", "teaspoons", "tsp"], "tsp"),
}
# Unit spellings that are also ordinary words or letters: a unit only right after a number ("5 m").
AMBIGUOUS_UNITS = _words("in m s c f l g h w v ha min sec second seconds")
# Time units are everyday words ("what year", "how many days"): a unit after a number or every/per/each/a/an.
TIME_UNITS = _words("s min h day week month year")
TIME_OPENERS = _words("every per each a an many much")
# Words of one group exclude each other: a message with one and another with a different one ask for
# different things (generic English contrasts, not tuned per question).
CONTRASTS = [
    _words(group)
    for group in (
        "boiling freezing melting",
        "begin began start started end ended finish finished",
        "soft hard",
        "hot cold warm cool",
        "buy bought sell sold",
        "open close",
        "create add insert delete remove rename",
        "read write append",
        "before after",
        "increase decrease",
        "more less",
        "minimum maximum min max",
        "first last",
        "morning afternoon evening night",
        "plus minus times divided",
        "square cube",
        "import export",
        "win won lose lost",
        "upload download",
        "encrypt decrypt",
        "enable disable",
        "male female",
        "left right",
        "north south east west",
        "summer winter spring autumn",
        "inside outside",
        "above below",
        "push pull",
        "sort reverse shuffle",
        "hide show",
        "black white green red blue yellow",
        "cat dog",
    )
]
WH = {"who": "person", "whom": "person", "whose": "person", "when": "time", "where": "place", "why": "reason"}
TIME_NOUNS = _words("year years date day")
# Superlatives change the question ("largest" / "smallest"); these words only look like one.
NOT_SUPERLATIVES = _words(
    "interest test rest west request suggest honest forest guest chest nest protest digest contest "
    "harvest invest manifest earnest modest quest arrest pest vest crest priest"
)
NOT_NAMES = _words(
    "i i'm i've i'd us"  # capitalised pronouns are not names
)


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


def _norm(word: str) -> str:
    w = word.lower().replace("’", "'")
    w = w.removesuffix("'s")
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


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
        if low in NUMBER_WORDS or _NUMBER.fullmatch(tok):
            numbers.append(low.replace(",", ""))
        negated = negated or low in NEGATIONS or low.endswith("n't")
        if (unit := _unit(prev.lower(), tok)) is not None:
            units.add(unit)
        if tok[:1].isalpha():
            words.add(_norm(tok))
            if tok[:1].isupper() and prev not in ".!?;:" and low not in NOT_NAMES:
                names.add(_norm(tok))
        prev = tok
    lower = [t.lower() for t in tokens]
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
    )


def _contrasting(a: Facts, b: Facts) -> bool:
    for group in CONTRASTS:
        in_a, in_b = a.words & group, b.words & group
        if in_a and in_b and not in_a & in_b:
            return True
    return False


def same_facts(a: Facts, b: Facts) -> bool:
    """Equal numbers, negation, units, number-unit pairs and superlatives; each message's names appear
    in the other; the same kind of question (who/when/where/why) when both say; no contrasting words."""
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
    )
