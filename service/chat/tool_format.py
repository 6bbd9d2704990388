"""One loaded model's tool-call format: its family and the family's markers in its vocabulary.

The HTTP API builds each request's grammar and reads each answer's calls through
it; ``GetModelInfo`` and ``/v1/models`` report it (``describe``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from service.chat.calls import Function
from service.chat.conversation import Caps
from service.chat.families import Family
from service.chat.markup import Markup
from service.chat.reader import Stream

RENDERED = ("system", "tools", "calls", "results", "multi_calls")


@dataclass(frozen=True)
class ToolFormat:
    family: Family
    markup: Markup
    caps: Caps

    @property
    def parallel(self) -> bool:
        """The family writes several calls in one answer."""
        return self.family.syntax.parallel

    @property
    def tools_path(self) -> str:
        """How tools reach the model: "template" or "system_turn" (the server's description)."""
        return "template" if self.caps.tools else "system_turn"

    def renders(self) -> list[str]:
        """What the chat template renders itself (of ``RENDERED``)."""
        on = {f.name for f in fields(self.caps) if getattr(self.caps, f.name) is True}
        return [r for r in RENDERED if r in on]

    def grammar(self, functions: Sequence[Function], required: bool, parallel: bool) -> str:
        """The Lark grammar of an answer: the calls alone (``required``), or text until the family's trigger."""
        return self.family.syntax.grammar(functions, required, parallel, self.markup)

    def stream(self, functions: Sequence[Function]) -> Stream:
        """A parser of one answer (its text with the markers shown)."""
        return self.family.syntax.stream(functions)
