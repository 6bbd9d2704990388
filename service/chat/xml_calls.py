"""XML-style calls: the function's name, then each argument as a tagged key and value (Qwen3-Coder, GLM, MiniMax,
DeepSeek V3.2/V4).

``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>``
and its relatives: a value whose property is a string is written as it is, any
other value as JSON (what the templates' ``v | tojson if v is not string else v``
render; DeepSeek's DSML marks which in the key's close, ``string="true"`` or ``"false"``:
``json_key_close``). The grammar writes each function's properties in the order of its
schema (the required ones always, the others optionally), a string as free text
that cannot contain the value's closing marker and any other value under its
property's schema (a string's ``enum``, ``const``, ``minLength`` and ``maxLength`` are in its
grammar too, and a ``pattern`` in the syntax every regex engine here shares: ``_pattern``). The parser gives the arguments as one JSON object, emitted a parameter at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.chat.calls import CallSyntaxError, Function, ToolCall
from service.chat.markup import Markup, literal
from service.chat.reader import Reader, Wait
from service.chat.syntax import Esc, Layout, Syntax, deep, json_rule, regex_text, seq


def is_string(schema: Any) -> bool:
    """A property whose values are strings (written bare)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    return kind == "string" or (kind is None and "enum" in schema and all(isinstance(v, str) for v in schema["enum"]))


def _choices(schema: dict[str, Any]) -> str | None:
    """The values of a string property with ``enum`` or ``const`` as Lark alternatives (None: free text)."""
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        return None
    return "(" + " | ".join(literal(v) for v in values) + ")"


def _value(schema: dict[str, Any], end: str = "") -> str:
    """The regex of a free string value that ends at ``end`` ("": at a special token): its ``pattern`` where
    ``_pattern`` can take it, else any characters (``minLength``/``maxLength`` when given).

    NOTE: a value ended by text is a lazy lexeme (it ends at the first ``end``), which keeps the parse and
    the grammar in step only while the value cannot run on past an ``end`` it failed to match before: a
    pattern there must be anchored and unable to write ``end``'s first character (``_cannot_write``).
    """
    regex = _pattern(schema)
    if regex is not None and (not end or (regex.startswith("(?:") and regex.endswith(")")
                                          and _cannot_write(regex, end[0]))):
        return regex
    return f"(?s:.{_span(schema)})"


def _cannot_write(regex: str, ch: str) -> bool:
    """``regex`` (of ``_pattern``'s syntax) surely matches no text holding ``ch``: no ``.``, no negated
    class, and no class, escape or literal of it matches ``ch`` (conservative: False when unsure)."""
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "[":
            j = regex.find("]", i + 2)
            while j > 0 and regex[j - 1] == "\\":
                j = regex.find("]", j + 1)
            if j < 0 or regex[i + 1] == "^" or re.fullmatch(regex[i:j + 1], ch):
                return False
            i = j + 1
        elif c == "\\":
            if re.fullmatch(regex[i:i + 2], ch):
                return False
            i += 2
        elif c == "." or c == ch:
            return False
        else:
            i += 1
    return True


# What a pattern may not hold to be put in the grammar as it is: anchors and assertions llguidance's regexes
# lack (or mean otherwise), look-arounds, back-references, Unicode classes, and "/" (the Lark literal's end).
_FOREIGN = re.compile(r"\\[bBAzZGpPkK1-9]|\(\?(?!:)|/")


def _pattern(schema: dict[str, Any]) -> str | None:
    """A ``pattern`` of a bare string value as the value's regex, or None (left to the final validation).

    NOTE: JSON Schema patterns search (unanchored): ``^...$`` is the whole value, any other is found
    somewhere in it. Taken only alone (no ``minLength``/``maxLength``/``format`` beside it) and only in
    the syntax common to ECMA-262, Python and llguidance's regexes: anything else stays checked after
    generation (the call then fails with ``schema_not_enforced`` when the model broke it).
    """
    p = schema.get("pattern")
    if not isinstance(p, str) or not p or any(k in schema for k in ("minLength", "maxLength", "format")):
        return None
    start, end = p.startswith("^"), p.endswith("$") and not p.endswith("\\$")
    inner = p[int(start): len(p) - int(end)]
    if _FOREIGN.search(inner) or _anchored(inner):
        return None
    try:
        re.compile(inner)
    except re.error:
        return None
    return ("" if start else "(?s:.*)") + f"(?:{inner})" + ("" if end else "(?s:.*)")


def _anchored(regex: str) -> bool:
    """``regex`` has a ``^`` or ``$`` outside a character class (one not escaped)."""
    i, depth = 0, False
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            depth = True
        elif c == "]":
            depth = False
        elif c in "^$" and not depth:
            return True
        i += 1
    return False


def _span(schema: dict[str, Any]) -> str:
    """The repetition of a free string value's characters: ``minLength``/``maxLength`` when given.

    NOTE: ``format`` is not in the value's grammar (a bare value is no JSON string for llguidance's JSON
    compiler to constrain), nor a ``pattern`` ``_pattern`` cannot take; the arguments are validated
    against the schema at the end.
    """
    low, high = schema.get("minLength"), schema.get("maxLength")
    low = low if isinstance(low, int) and low >= 0 else 0
    if isinstance(high, int) and high >= low:
        return f"{{{low},{high}}}"
    return f"{{{low},}}" if low else "*"


def _before_special(parts: list[str | int]) -> str | None:
    """The text before the first special token of a value's closing (None: it has none there): the value's
    free text stops at that token (a greedy lexeme ending in the text, which no free text can run past)."""
    if parts and isinstance(parts[0], int):
        return ""
    if len(parts) > 1 and isinstance(parts[0], str) and isinstance(parts[1], int):
        return parts[0]
    return None


def _properties(f: Function) -> list[tuple[str, Any, bool]]:
    props = f.parameters.get("properties") if isinstance(f.parameters, dict) else None
    required = set(f.parameters.get("required") or []) if isinstance(f.parameters, dict) else set()
    return [(k, v, k in required) for k, v in props.items()] if isinstance(props, dict) else []


@dataclass(frozen=True)
class XmlCalls(Syntax):
    """``call_open`` NAME ``name_close`` (``param_open`` KEY ``key_close`` VALUE ``param_close``)* ``call_close``."""

    layout: Layout
    name_close: str = ""
    param_open: str = ""
    key_close: str = ""
    param_close: str = ""
    parallel: bool = True
    lead: str = ""
    json_key_close: str = ""  # the key's close before a JSON value, when it is not ``key_close`` (DeepSeek's)
    kind = "xml"

    def extra_markers(self) -> list[str]:
        return [self.name_close, self.param_open, self.key_close, self.json_key_close, self.param_close]

    def _key_close(self, string: bool) -> str:
        return self.key_close if string or not self.json_key_close else self.json_key_close

    def body(self, call: ToolCall, index: int, esc: Esc) -> str:
        try:
            args = json.loads(call.arguments)
        except (ValueError, RecursionError):
            args = None
        if not isinstance(args, dict):
            return esc(call.name) + self.name_close + esc(call.arguments)
        params = [self.param_open + esc(k) + self._key_close(isinstance(v, str))
                  + (esc(v) if isinstance(v, str) else json.dumps(deep(v, esc), ensure_ascii=False)) + self.param_close
                  for k, v in args.items()]
        return esc(call.name) + self.name_close + "".join(params)

    def body_rules(self, functions: Sequence[Function], markup: Markup) -> list[str]:
        m = markup
        rules = ["body: " + " | ".join(f"fn_{i}" for i in range(len(functions)))]
        close = m.parts(self.param_close)
        for i, f in enumerate(functions):
            items = []
            for j, (key, schema, required) in enumerate(_properties(f)):
                name = f"p_{i}_{j}"
                items.append(name if required else f"{name}?")
                string = is_string(schema)
                head = seq(m.lark(self.param_open), literal(key), m.lark(self._key_close(string)))
                if not string:
                    rules.append(f"{name}: {seq(head, json_rule(schema), m.lark(self.param_close))}")
                elif (choices := _choices(schema)) is not None:
                    rules.append(f"{name}: {seq(head, choices, m.lark(self.param_close))}")
                elif (text := _before_special(close)) is not None:  # a special token ends the value: text stops
                    rules.append(f"{name}: {seq(head, f'V_{i}_{j}', m.lark(self.param_close[len(text):]))}")
                    rules.append(f"V_{i}_{j}: /{_value(schema)}{regex_text(text)}/")
                else:  # NOTE: lazy: the value ends at the first occurrence of its closing text
                    end = close[0] if close and isinstance(close[0], str) else ""
                    rest = self.param_close[len(end):]
                    rules.append(f"{name}: {seq(head, f'v_{i}_{j}', m.lark(rest))}")
                    rules.append(f"v_{i}_{j}[lazy]: /{_value(schema, end)}{regex_text(end)}/")
            rules.append(f"fn_{i}: {seq(literal(f.name), m.lark(self.name_close), *items)}")
        return rules

    def read_body(self, r: Reader, index: int, functions: Mapping[str, Function]) -> Wait[None]:
        stops = (self.name_close,) if self.name_close else (self.param_open, self.layout.call_close)
        name, stop = yield from r.until(stops)
        if stop is None or name not in functions:
            raise CallSyntaxError(f"a call names {name[:64]!r}, which is not one of the tools")
        if not self.name_close:
            r.pos -= len(stop)
        props = {k: s for k, s, _ in _properties(functions[name])}
        r.begin(index, name)
        emit, first = r.args(index), True
        emit("{")
        closes = (self.key_close, self.json_key_close) if self.json_key_close else (self.key_close,)
        while (yield from r.take(self.param_open)):
            key, stop = yield from r.until(closes)
            value, stop2 = yield from r.until((self.param_close,))
            if stop is None or stop2 is None:
                raise CallSyntaxError("the output ended inside a parameter")
            # NOTE: a family that marks the value's kind (DeepSeek's string="true") is read by its mark
            string = stop == self.key_close if self.json_key_close else is_string(props.get(key))
            if string:
                value = json.dumps(value, ensure_ascii=False)
            else:
                try:
                    json.loads(value)
                except (ValueError, RecursionError):
                    raise CallSyntaxError(f"parameter {key[:64]!r} is not JSON") from None
            emit(("" if first else ", ") + json.dumps(key, ensure_ascii=False) + ": " + value)
            first = False
        emit("}")
