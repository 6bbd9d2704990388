"""Tool-call syntaxes: how a family writes calls, as data, with the parser and the grammar of each kind.

A ``Syntax`` knows one family's way of writing calls in its output:

* ``render(calls)``: the text the model writes for ``calls`` (earlier calls in a
  conversation whose template does not render them, and the example of the
  server's system-turn fallback);
* ``grammar(functions, required, parallel, markup)``: an llguidance Lark grammar of
  the output: with ``required`` the calls alone, else free text or, from the
  family's trigger on, the calls (a lazily triggered grammar: the text before the
  trigger is free, and cannot contain the trigger, so once the model writes it the
  calls follow under each function's ``parameters`` schema);
* ``stream(functions)``: the parser, fed the output as it is generated
  (``service.chat.reader``).

Two kinds here: ``JsonCalls`` (each call one JSON object holding the function's
name and its arguments: Hermes/Qwen, Llama 3.x, Mistral Nemo, Granite, Command R7B,
...) and ``NamedCalls`` (the name written before a JSON object of arguments:
Mistral v11, DeepSeek, Kimi K2, Functionary v3.1, ...). XML-style parameters are
``service.chat.xml_calls``, Functionary v3.2's recipient-headed messages
``service.chat.recipient_calls``. Arguments are JSON as ``tojson`` writes it (", "
and ": "), the way the templates render earlier calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.chat.calls import CallSyntaxError, Function, ToolCall
from service.chat.markup import Markup, literal
from service.chat.reader import Reader, Stream, Wait
from service.grammar.schema import loosen
from service.json_grammar import JSON_OPTIONS

Esc = Callable[[str], str]
# NOTE: the layout tojson gives (Python's json.dumps defaults): what the models saw for earlier calls.
X_GUIDANCE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False, "coerce_one_of": True}
_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")
_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
SLOT = re.compile(r"\{(index|id)\}")
ID_CHARS = "/[a-zA-Z0-9]{9}/"


def _same(text: str) -> str:
    return text


def regex_text(text: str) -> str:
    """``text`` as a literal inside an llguidance ``/.../`` regex (Rust syntax: only its meta characters)."""
    out = []
    for c in text:
        out.append("\\" + c if c in _REGEX_META else _CONTROL.get(c, c))
    return "".join(out)


def json_rule(schema: Mapping[str, Any], compact: bool = False) -> str:
    """A ``%json`` item of ``schema`` in the templates' layout, or (``compact``) the layout of every JSON
    output (``json_grammar.JSON_OPTIONS``: a document after a reasoning model's thought); a caller's
    ``x-guidance`` is replaced.

    NOTE: loosened (``service.grammar.schema.loosen``: keywords llguidance does not compile that only
    restrict are left out, ``oneOf`` is taken as ``anyOf``): every call is validated against its function's
    own schema once it is complete (``service.http.tools.CallReader``), a document against its schema.
    """
    layout = {**JSON_OPTIONS, "coerce_one_of": True} if compact else X_GUIDANCE
    return "%json " + json.dumps({**loosen(dict(schema)), "x-guidance": layout}, ensure_ascii=False)


def deep(value: Any, esc: Esc) -> Any:
    """``value`` with ``esc`` applied to every string in it (keys too)."""
    if isinstance(value, str):
        return esc(value)
    if isinstance(value, dict):
        return {esc(k): deep(v, esc) for k, v in value.items()}
    if isinstance(value, list):
        return [deep(v, esc) for v in value]
    return value


def args_json(arguments: str, esc: Esc = _same) -> str:
    """A call's arguments in the templates' JSON layout; text that is not JSON is kept (escaped) as it is."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return esc(arguments)
    try:
        return json.dumps(deep(value, esc), ensure_ascii=False)
    except (ValueError, RecursionError):
        return esc(arguments)


def seq(*items: str) -> str:
    return " ".join(i for i in items if i)


@dataclass(frozen=True)
class Layout:
    """Where calls sit in the output: ``start`` + ``list_open`` + calls joined by ``sep`` + ``list_close`` +
    ``end``, each call ``call_open`` + body + ``call_close``."""

    start: str = ""
    list_open: str = ""
    call_open: str = ""
    call_close: str = ""
    sep: str = ""
    list_close: str = ""
    end: str = ""

    @property
    def opening(self) -> str:
        return self.start + self.list_open + self.call_open

    def markers(self) -> list[str]:
        return [self.start, self.list_open, self.call_open, self.call_close, self.sep, self.list_close, self.end]


class Syntax:
    """The shared parts of a call syntax (see the module doc); subclasses give the body of one call."""

    kind = ""
    layout: Layout
    parallel: bool  # the family writes several calls in one answer
    lead: str  # an optional marker before the calls (Llama's <|python_tag|>)

    # -- per kind ---------------------------------------------------------------------------------
    def body(self, call: ToolCall, index: int, esc: Esc) -> str:
        raise NotImplementedError

    def body_rules(self, functions: Sequence[Function], markup: Markup) -> list[str]:
        """Lark rules defining ``body`` (one call's body) over ``functions``."""
        raise NotImplementedError

    def read_body(self, r: Reader, index: int, functions: Mapping[str, Function]) -> Wait[None]:
        raise NotImplementedError

    def extra_markers(self) -> list[str]:
        return []

    # -- shared -----------------------------------------------------------------------------------
    @property
    def trigger(self) -> str:
        """The text that starts the calls ("": calls only at the very start of the output)."""
        return self.layout.opening.rstrip()

    def markers(self) -> list[str]:
        return [m for m in (*self.layout.markers(), self.lead, *self.extra_markers()) if m]

    def written(self, content: str, calls: Sequence[ToolCall]) -> str:
        """What the model writes after the generation prompt for an answer of ``content`` then ``calls``."""
        return content + (self.render(calls) if calls else "")

    def render(self, calls: Sequence[ToolCall], esc: Esc = _same) -> str:
        lay = self.layout
        bodies = [lay.call_open + self.body(c, i, esc) + lay.call_close for i, c in enumerate(calls)]
        return lay.start + lay.list_open + lay.sep.join(bodies) + lay.list_close + lay.end

    def grammar(self, functions: Sequence[Function], required: bool, parallel: bool, markup: Markup) -> str:
        lay, m = self.layout, markup
        more = f"({seq(m.lark(lay.sep), 'call')})*" if parallel and self.parallel else ""
        tail = [m.lark(lay.call_close), more, m.lark(lay.list_close + lay.end)]
        rules = [f"call: {seq(m.lark(lay.call_open), 'body', m.lark(lay.call_close))}",
                 *self.body_rules(functions, markup)]
        opening = lay.opening
        if required or not self.trigger:
            lead = f"({m.lark(self.lead)})?" if self.lead else ""
            rules.insert(0, f"calls: {seq(lead, m.lark(opening), 'body', *tail)}")
            if required:
                return "\n".join(["start: calls", *rules]) + "\n"
            # NOTE: calls only at the start (Llama's bare JSON): text must not start with "{"
            return "\n".join(["start: TEXT | calls", "TEXT: /([^{](?s:.*))?/", *rules]) + "\n"
        parts = m.parts(opening)
        first = parts[0]
        if isinstance(first, int):  # a special token starts the calls: free text cannot reach it
            head = ["start: TEXT | TEXT calls", "TEXT: /(?s:.*)/"]
            rules.insert(0, f"calls: {seq(m.lark(opening), 'body', *tail)}")
        elif len(parts) > 1 and isinstance(parts[1], int):
            # NOTE: text then a special token (DeepSeek's "<" before ｜DSML｜): a greedy lexeme ending in that
            # text ends where the special token comes, which free text never holds
            head = ["start: TEXT | HEAD calls", "TEXT: /(?s:.*)/", f"HEAD: /(?s:.*){regex_text(first)}/"]
            rules.insert(0, f"calls: {seq(m.lark(opening[len(first):]), 'body', *tail)}")
        else:  # NOTE: a lazy lexeme ends at the trigger's first occurrence; the text alone never holds it
            trigger = first.rstrip() or first
            t = regex_text(trigger)
            head = ["start: TEXT | head calls", f"TEXT: /(?s:.*)/ & ~/(?s:.*){t}(?s:.*)/",
                    f"head[lazy]: /(?s:.*){t}/"]
            rules.insert(0, f"calls: {seq(m.lark(opening[len(trigger):]), 'body', *tail)}")
        return "\n".join([*head, *rules]) + "\n"

    def stream(self, functions: Sequence[Function]) -> Stream:
        by_name = {f.name: f for f in functions}
        return Stream(lambda r: self._parse(r, by_name))

    def _parse(self, r: Reader, functions: Mapping[str, Function]) -> Iterator[None]:
        lay = self.layout
        if not (yield from self._opening(r)):
            return
        yield from r.expect(lay.start + lay.list_open)
        index, more = 0, lay.sep + lay.call_open
        while True:
            yield from r.expect(lay.call_open)
            yield from self.read_body(r, index, functions)
            yield from r.expect(lay.call_close)
            if not (yield from self._another(r, more)):
                break
            index += 1
        yield from r.expect(lay.list_close + lay.end)
        if not (yield from r.at_end()):
            raise CallSyntaxError(f"text after the calls: {r.buf[r.pos:r.pos + 20]!r}")

    def _another(self, r: Reader, more: str) -> Wait[bool]:
        """Another call follows (its separator read, its opening left unread); its closing is looked for first,
        since a separator may begin it (MiniMax M1's "\n")."""
        closing = self.layout.list_close + self.layout.end
        if closing and (yield from r.take(closing)):
            r.pos -= len(closing)
            return False
        if not more or not (yield from r.take(more)):
            return False
        r.pos -= len(self.layout.call_open)
        return True

    def _opening(self, r: Reader) -> Wait[bool]:
        """Content up to the calls (left unread), or all of the output when there are none (False)."""
        if self.trigger:
            # NOTE: a lead before the trigger (DeepSeek's "\n\n") is the calls', not the content's
            stops = (self.lead + self.trigger, self.trigger) if self.lead else (self.trigger,)
            _, stop = yield from r.until(stops, r.content)
            if stop is not None:
                r.pos -= len(self.trigger)
            return stop is not None
        if self.lead and (yield from r.take(self.lead)):
            return True
        if (yield from r.take("{")):  # NOTE: bare JSON calls start the output, or there are none
            r.pos -= 1
            return True
        yield from r.rest()
        return False


def _known(name: str, functions: Mapping[str, Function]) -> None:
    if name not in functions:
        raise CallSyntaxError(f"a call names {name[:64]!r}, which is not one of the tools")


@dataclass(frozen=True)
class JsonCalls(Syntax):
    """Each call one JSON object: ``keys`` in order, among ``name_key``, ``args_key`` and ``id_key`` (whose
    value matches ``id_pattern``; rendered by ``id_of``)."""

    layout: Layout
    name_key: str = "name"
    args_key: str = "arguments"
    id_key: str = ""
    id_pattern: str = "^[a-zA-Z0-9]{9}$"
    order: tuple[str, ...] = ("name", "args", "id")
    parallel: bool = True
    lead: str = ""
    id_of: Callable[[ToolCall, int], str] | None = None
    kind = "json"

    def _keys(self) -> list[tuple[str, str]]:
        keys = {"name": self.name_key, "args": self.args_key, "id": self.id_key}
        return [(role, keys[role]) for role in self.order if keys[role]]

    def body(self, call: ToolCall, index: int, esc: Esc) -> str:
        values = {"name": json.dumps(esc(call.name), ensure_ascii=False), "args": args_json(call.arguments, esc),
                  "id": json.dumps(self.id_of(call, index) if self.id_of else call.id)}
        return "{" + ", ".join(f"{json.dumps(key)}: {values[role]}" for role, key in self._keys()) + "}"

    def body_rules(self, functions: Sequence[Function], markup: Markup) -> list[str]:
        options = []
        for f in functions:
            props: dict[str, Any] = {}
            for role, key in self._keys():
                props[key] = {"const": f.name} if role == "name" else f.parameters if role == "args" else {
                    "type": "string", "pattern": self.id_pattern}
            options.append({"type": "object", "properties": props, "required": list(props),
                            "additionalProperties": False})
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return [f"body: {json_rule(schema)}"]

    def read_body(self, r: Reader, index: int, functions: Mapping[str, Function]) -> Wait[None]:
        """``{"key": value, ...}``: the name (and id) whole, the arguments emitted as they are read."""
        yield from r.expect("{")
        name, call_id, begun = "", "", False
        roles = {key: role for role, key in self._keys()}
        while True:
            role = roles.get(json.loads((yield from r.json_value())))
            yield from r.expect(": ")
            if role == "args":
                if not name:
                    raise CallSyntaxError("the arguments come before the function's name")
                r.begin(index, name, call_id)
                begun = True
                yield from r.json_value(r.args(index))
            else:
                value = json.loads((yield from r.json_value()))
                if role == "name":
                    _known(value, functions)
                    name = value
                elif role == "id" and isinstance(value, str):
                    call_id = value
            if not (yield from r.take(", ")):
                break
        yield from r.expect("}")
        if not begun:
            raise CallSyntaxError("a call without its arguments")


@dataclass(frozen=True)
class NamedCalls(Syntax):
    """Each call: the function's name, ``name_close`` (may hold ``{index}`` and ``{id}`` slots: the call's
    position, a 9-character id), then the arguments as a JSON object."""

    layout: Layout
    name_close: str = ""
    parallel: bool = True
    lead: str = ""
    id_of: Callable[[ToolCall, int], str] | None = None
    kind = "named"

    def extra_markers(self) -> list[str]:
        return [p for p in SLOT.split(self.name_close) if p and p not in ("index", "id")]

    def _close(self, call: ToolCall, index: int) -> str:
        ident = self.id_of(call, index) if self.id_of else call.id
        return self.name_close.replace("{index}", str(index)).replace("{id}", ident)

    def body(self, call: ToolCall, index: int, esc: Esc) -> str:
        return esc(call.name) + self._close(call, index) + args_json(call.arguments, esc)

    def _close_lark(self, markup: Markup) -> str:
        items = []
        for part in SLOT.split(self.name_close):
            items.append("/[0-9]{1,3}/" if part == "index" else ID_CHARS if part == "id" else markup.lark(part))
        return seq(*items)

    def body_rules(self, functions: Sequence[Function], markup: Markup) -> list[str]:
        close = self._close_lark(markup)
        rules = ["body: " + " | ".join(f"fn_{i}" for i in range(len(functions)))]
        rules += [f"fn_{i}: {seq(literal(f.name), close, json_rule(f.parameters))}" for i, f in enumerate(functions)]
        return rules

    def read_body(self, r: Reader, index: int, functions: Mapping[str, Function]) -> Wait[None]:
        parts = SLOT.split(self.name_close)
        name, stop = yield from r.until((parts[0],))
        if stop is None:
            raise CallSyntaxError("the output ended inside a function's name")
        _known(name, functions)
        call_id = ""
        for i in range(1, len(parts), 2):
            value, stop = yield from r.until((parts[i + 1],))
            if stop is None or not value:
                raise CallSyntaxError(f"the output ended before {parts[i + 1]!r}")
            call_id = value if parts[i] == "id" else call_id
        r.begin(index, name, call_id)
        yield from r.json_value(r.args(index))
