"""Recipient-headed calls: each message of the answer names its recipient first (Functionary v3.2).

``>>>all\\nTEXT`` is text for the user, ``>>>NAME\\n{ARGS}`` a call; an answer is
text, calls, or text then calls. The generation prompt ends with the first
``>>>`` (``primer``), so the output itself starts with the recipient: ``all\\n``
and the text, or the first call's name; each further call is ``>>>NAME\\n{ARGS}``.
The content is the text after ``all\\n``. Earlier calls render through the
template itself, as ``>>>NAME\\nARGS`` each.

NOTE: the trigger is at the very start of the output, so the grammar of
``tool_choice: "auto"`` is not lazy there: the output starts with ``all\\n``
(then free text that may end in ``>>>`` and calls) or with a call; a function
named ``all`` would be read as text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from service.chat.calls import CallSyntaxError, Function, ToolCall
from service.chat.markup import Markup
from service.chat.reader import Reader
from service.chat.syntax import NamedCalls, regex_text, seq


@dataclass(frozen=True)
class RecipientCalls(NamedCalls):
    """``NamedCalls`` with ``layout.call_open`` (``>>>``) written by the prompt before the output's first
    message, and ``text_open`` (``all\\n``) heading text."""

    text_open: str = "all\n"
    kind = "recipient"

    @property
    def trigger(self) -> str:
        return self.layout.call_open

    @property
    def primer(self) -> str:
        """What the generation prompt writes before the output (the first message's ``>>>``)."""
        return self.layout.call_open

    def written(self, content: str, calls: Sequence[ToolCall]) -> str:
        if content or not calls:
            return self.text_open + content + self.render(calls)
        return self.render(calls)[len(self.primer):]

    def grammar(self, functions: Sequence[Function], required: bool, parallel: bool, markup: Markup) -> str:
        m = markup
        more = f"({seq(m.lark(self.layout.call_open), 'body')})*" if parallel and self.parallel else ""
        rules = [f"calls: {seq('body', more)}", *self.body_rules(functions, markup)]
        if required:
            return "\n".join(["start: calls", *rules]) + "\n"
        t = regex_text(self.trigger)
        text = m.lark(self.text_open)
        head = [f"start: {text} TEXT | {text} head calls | calls", f"TEXT: /(?s:.*)/ & ~/(?s:.*){t}(?s:.*)/",
                f"head[lazy]: /(?s:.*){t}/"]
        return "\n".join([*head, *rules]) + "\n"

    def _parse(self, r: Reader, functions: Mapping[str, Function]) -> Iterator[None]:
        if (yield from r.take(self.text_open)):
            _, stop = yield from r.until((self.trigger,), r.content)
            if stop is None:
                return
        index = 0
        while True:
            yield from self.read_body(r, index, functions)
            if not (yield from r.take(self.layout.call_open)):
                break
            index += 1
        if not (yield from r.at_end()):
            raise CallSyntaxError(f"text after the calls: {r.buf[r.pos:r.pos + 20]!r}")
