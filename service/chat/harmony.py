"""gpt-oss's harmony calls: a call is a message to ``functions.NAME`` on the commentary channel.

After the generation prompt's ``<|start|>assistant`` (or after the thought, whose
end marker ends with it: ``service.chat.thinking``) the model writes one message:
the final answer (``<|channel|>final<|message|>TEXT``, whose header the thought
reader drops: ``Thinking.answer_open``) or a call, with its recipient in the
role part, as the template renders earlier calls::

    to=functions.NAME<|channel|>commentary json<|message|>{ARGS}<|call|>

or in the channel part, as the models also write them (and llama.cpp accepts)::

    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>

The grammar generates the template's order; the parser reads both (and the
analysis channel in place of commentary). ``<|call|>`` ends the generation (an
end-of-generation token, never in the text), so an answer holds one call: the
family is not parallel, and a turn of several calls in a conversation is
rendered one call per turn (``service.chat.conversation``), as the template
renders only a turn's first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from service.chat.calls import CallSyntaxError, Function, ToolCall
from service.chat.markup import Markup, literal
from service.chat.reader import Reader, Wait
from service.chat.syntax import Esc, Layout, Syntax, _known, args_json, json_rule, seq

ROLE = " to=functions."  # the recipient in the role part: the template's order
CHANNELS = ("<|channel|>commentary to=functions.", "<|channel|>analysis to=functions.")
HEADER = "<|channel|>commentary json<|message|>"  # after the name, in the template's order
FINAL = "<|channel|>final<|message|>"  # a text answer's header (the grammar writes it; the reader drops it)
CALL, NEXT = "<|call|>", "<|start|>assistant"
LAYOUT = Layout(call_open=ROLE, call_close=CALL, sep=NEXT)  # as the template renders earlier calls


@dataclass(frozen=True)
class HarmonyCalls(Syntax):
    """One call per answer, in harmony's messages (see the module doc)."""

    layout: Layout = LAYOUT
    parallel: bool = False
    lead: str = ""
    kind = "harmony"

    @property
    def trigger(self) -> str:
        """None: the message's header decides at the answer's start (nothing free comes before a call)."""
        return ""

    def extra_markers(self) -> list[str]:
        return [HEADER, FINAL, *CHANNELS, "<|constrain|>json<|message|>"]

    def body(self, call: ToolCall, index: int, esc: Esc) -> str:
        return esc(call.name) + HEADER + args_json(call.arguments, esc)

    def body_rules(self, functions: Sequence[Function], markup: Markup) -> list[str]:
        rules = ["body: " + " | ".join(f"fn_{i}" for i in range(len(functions)))]
        header = markup.lark(HEADER)
        rules += [f"fn_{i}: {seq(literal(f.name), header, json_rule(f.parameters))}" for i, f in enumerate(functions)]
        return rules

    def grammar(self, functions: Sequence[Function], required: bool, parallel: bool, markup: Markup) -> str:
        """The call alone (``required``), or the final channel's free text or the call: the message's header
        decides, so nothing is free before it. NOTE: the call's end is the model's ``<|call|>``, an
        end-of-generation token (the grammar's end), so it is in the grammar only where it is text."""
        end = "" if markup.is_special(CALL) else f"({literal(CALL)})?"
        rules = [f"call: {seq(literal(ROLE), 'body', end)}", *self.body_rules(functions, markup)]
        if required:
            return "\n".join(["start: call", *rules]) + "\n"
        return "\n".join(["start: text | call", f"text: {markup.lark(FINAL)} /(?s:.*)/", *rules]) + "\n"

    def _parse(self, r: Reader, functions: Mapping[str, Function]) -> Iterator[None]:
        """A call in either order, or text (all of the answer: the reader dropped the final channel's header)."""
        if (yield from r.take(ROLE)):
            name = yield from self._name(r, ("<|channel|>",), functions)
        else:
            for channel in CHANNELS:
                if (yield from r.take(channel)):
                    name = yield from self._name(r, (" ", "<|message|>"), functions)
                    break
            else:
                yield from r.rest()
                return
        if r.buf[r.pos - len("<|message|>"):r.pos] != "<|message|>":
            _, stop = yield from r.until(("<|message|>",))  # the channel and content type ("commentary json")
            if stop is None:
                raise CallSyntaxError("the output ended before the call's <|message|>")
        r.begin(0, name)
        yield from r.json_value(r.args(0))
        yield from r.take(CALL)  # NOTE: shown only when the model wrote it as text
        if not (yield from r.at_end()):
            raise CallSyntaxError(f"text after the call: {r.buf[r.pos:r.pos + 20]!r}")

    @staticmethod
    def _name(r: Reader, stops: tuple[str, ...], functions: Mapping[str, Function]) -> Wait[str]:
        name, stop = yield from r.until(stops)
        if stop is None:
            raise CallSyntaxError("the output ended inside a function's name")
        _known(name, functions)
        return name
