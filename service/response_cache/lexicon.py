"""Word lists of the semantic cache's fact guard (``facts``): numbers, negations, units, contrasts.

Generic English, not tuned per question: a reviewer should be able to read every group as "these words
ask for different things". Inflections of the adjective groups (comparative, superlative) are generated.
"""

from __future__ import annotations


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
TIME_OPENERS = _words("every per each a an one many much")


def norm(word: str) -> str:
    """Lower case, no possessive, no plural ``s`` (crude, but the same on both sides of a comparison)."""
    w = word.lower().replace("’", "'")
    w = w.removesuffix("'s")
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


# Each group lists classes of words that exclude each other (synonyms within a class joined by "/"):
# one message with a word of one class and the other with a word of another class only (and none of
# the first) ask for different things. NOTE: a false contrast only costs a hit; a missing one can
# serve a wrong answer, so groups are broad.
GROUPS = (
    # states, processes, directions of change
    "boiling/boil freezing/freeze melting/melt",
    "begin/began/start/started/starting ending/end/ended/finish/finished/stop/stopped",
    "buy/bought/purchase/buying sell/sold/selling",
    "open/opening close/closing/shut",
    "create/add/insert/append delete/remove/drop rename/move copy/duplicate",
    "read/reading write/writing",
    "before/prior after/following",
    "increase/raise/rise/grow/gain decrease/reduce/lower/drop/fall/shrink/lose",
    "more/greater less/fewer",
    "minimum/min/least maximum/max/most",
    "first/earliest last/latest",
    "plus/add/addition/sum minus/subtract/subtraction times/multiply/multiplied/multiplication "
    "divided/divide/division",
    "square cube",
    "import/importing export/exporting",
    "win/won/winning/beat lose/lost/losing/loss draw/tie",
    "upload download",
    "encrypt/encryption decrypt/decryption",
    "encode/encoding decode/decoding",
    "compress/compression decompress/decompression/extract",
    "serialize/serialization deserialize/deserialization",
    "enable/enabled disable/disabled",
    "push pull",
    "sort/sorted reverse/reversed shuffle/shuffled",
    "hide show",
    "deposit withdraw/withdrawal",
    "borrow/borrower/borrowing lend/lender/lending",
    "debit credit",
    "asset liability",
    "income/revenue expense/cost",
    "profit loss",
    "arrive/arrival depart/departure",
    "enter/entry/entrance exit",
    "inhale exhale",
    "input output",
    "inbound/incoming outbound/outgoing",
    "accept/approve/approved reject/rejected/deny/denied/decline",
    "allow/allowed/permit/permitted/legal forbid/forbidden/prohibit/prohibited/ban/banned/illegal",
    "required/mandatory/compulsory optional/voluntary",
    "include/including exclude/excluding",
    "pass/passed fail/failed",
    "true false",
    "positive negative",
    "odd even",
    "public private",
    "internal external",
    "domestic international/foreign",
    "online offline",
    "horizontal vertical",
    "ascending descending",
    "uppercase/upper lowercase/lower",
    "clockwise counterclockwise/anticlockwise",
    "solid liquid gas",
    "acid/acidic alkaline/alkali",
    "raw cooked/baked/fried/boiled/roasted/grilled",
    "fresh frozen/canned/dried",
    "sweet sour bitter salty",
    # people and roles
    "male female",
    "man/men woman/women",
    "boy girl",
    "father/dad mother/mom/mum",
    "son daughter",
    "brother sister",
    "husband wife",
    "king queen",
    "uncle aunt",
    "adult child/kid/children",
    "buyer/purchaser seller/vendor",
    "landlord tenant",
    "employer employee",
    "plaintiff defendant",
    "creditor debtor",
    "teacher student",
    "doctor patient",
    "parent child/children",
    "host guest",
    "client server",
    "sender recipient/receiver",
    "winner loser",
    "offense/offence/attack/attacker/attacking defense/defence/defender/defending",
    "home away",
    # time
    "yesterday today tomorrow tonight",
    "past present/current future",
    "this/current previous/last/prior next/upcoming",
    "hourly daily weekly monthly quarterly yearly/annual/annually",
    "morning afternoon evening night",
    "breakfast lunch dinner",
    "am pm",
    "weekday weekend",
    "sunrise sunset",
    "summer winter spring autumn/fall",
    "ancient modern",
    # place and direction
    "north/northern south/southern east/eastern west/western",
    "left right",
    "top bottom",
    "front back/rear",
    "inside/indoor/indoors outside/outdoor/outdoors",
    "above below/under/beneath",
    "up down",
    "upstairs downstairs",
    "forward backward",
    "uphill downhill",
    # frequency and quantity
    "always usually/often sometimes rarely/seldom",
    "all some none",
    "many/much few/little",
    "single double",
    # colours and common kinds
    "black white green red blue yellow orange purple pink brown grey/gray",
    "cat dog",
)
# Adjectives: their comparatives and superlatives join the class ("bigger" / "smallest").
ADJECTIVE_GROUPS = (
    "big/large/huge small/little/tiny",
    "high low",
    "tall short",
    "long short",
    "fast/quick slow",
    "cheap/inexpensive expensive/costly",
    "hot warm cool cold",
    "heavy light",
    "old new",
    "old young",
    "early late",
    "easy/simple hard/difficult",
    "soft hard",
    "strong weak",
    "thick thin",
    "wide/broad narrow",
    "deep shallow",
    "rich poor",
    "wet dry",
    "safe dangerous/risky",
    "good bad",
    "better worse",
    "best worst",
    "loud quiet",
    "bright dark",
    "clean dirty",
    "near/close far",
    "full empty",
    "healthy unhealthy",
)


def _inflect(word: str) -> set[str]:
    forms = {word}
    if word.endswith("e"):
        forms |= {word + "r", word + "st"}
    elif word.endswith("y") and len(word) > 3:
        forms |= {word[:-1] + "ier", word[:-1] + "iest"}
    else:
        forms |= {word + "er", word + "est"}
        if (
            len(word) <= 4
            and word[-1] not in "aeiouwy"
            and word[-2] in "aeiou"
            and word[-3:-2] not in "aeiou"
        ):
            forms |= {word + word[-1] + "er", word + word[-1] + "est"}  # big -> bigger
    return forms


def _group(spec: str, inflect: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, cls in enumerate(spec.split()):
        for word in cls.split("/"):
            for form in _inflect(word) if inflect else {word}:
                out[norm(form)] = i
    return out


CONTRASTS = [_group(g, False) for g in GROUPS] + [_group(g, True) for g in ADJECTIVE_GROUPS]
# Prefixes that negate a word ("safe" / "unsafe", "install" / "uninstall"); stems shorter than 4 letters
# are left alone ("to" / "into").
NEGATING_PREFIXES = ("un", "non", "non-", "dis", "in", "im", "il", "ir")

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
# Words that carry no content of their own: a rewording may add, drop or change them freely.
# NOTE: normalised like the messages' words ("this" -> "thi", "does" -> "doe").
FUNCTION_WORDS = frozenset(
    norm(w)
    for w in _words(
        "a an the i me my we us our you your he him his she her it its they them their this that these those "
        "what which who whom whose when where why how is are was were be been being do does doe did done have has "
        "had can could should would will shall may might must to of in on at by for with from into about as than "
        "then so and or but if please exactly actually really just tell know want like get there here some any "
        "one also ever currently usually generally considered known called named regarded"
    )
)
