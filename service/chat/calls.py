"""The pieces every tool-call syntax shares: a call, a function, and what a parser emits as it reads.

A syntax's parser (``Syntax.stream``) reads a model's output as it is generated and
emits ``Piece`` values: ``Content`` (text that is the answer, before any call),
``Begin`` (call ``index`` starts, its function's name known) and ``Args`` (the next
piece of that call's arguments, JSON text). The pieces of a whole output, folded by
``fold``, are the answer: its text and its calls, each call's arguments the
concatenation of its ``Args`` pieces, so a streamed answer and a whole one are equal
by construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class CallSyntaxError(ValueError):
    """Output that does not follow the family's call syntax (under its grammar: a server bug)."""


@dataclass(frozen=True)
class ToolCall:
    """One function call: an earlier one in a conversation, or one parsed from the model's output."""

    name: str
    arguments: str  # JSON text: the caller's, or exactly what the model wrote (or its JSON form)
    id: str = ""  # the caller's id, or the one the model wrote (families whose calls carry one); "": none


@dataclass(frozen=True)
class Function:
    """A function the model may call: its name, the JSON Schema of its arguments, what it does."""

    name: str
    parameters: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class Begin:
    index: int
    name: str
    id: str = ""  # the id the model wrote, when the syntax carries one


@dataclass(frozen=True)
class Args:
    index: int
    text: str


Piece = Content | Begin | Args


@dataclass
class Folded:
    """An output's pieces folded: the answer's text and its calls (in order)."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def fold(pieces: Iterable[Piece]) -> Folded:
    """``Content`` joined, and one ``ToolCall`` per ``Begin`` with its ``Args`` joined."""
    out = Folded()
    names: list[tuple[str, str]] = []
    args: list[list[str]] = []
    for p in pieces:
        if isinstance(p, Content):
            out.content += p.text
        elif isinstance(p, Begin):
            names.append((p.name, p.id))
            args.append([])
        else:
            args[p.index].append(p.text)
    out.calls = [ToolCall(name, "".join(a), cid) for (name, cid), a in zip(names, args, strict=True)]
    return out
