"""A conversation -> what its chat template renders: messages, tools and variables, as Hugging Face passes them.

The input has Hugging Face ``apply_chat_template``'s shape (OpenAI's messages:
``tool_calls`` with ``function.name`` / ``function.arguments``, ``tool`` messages
with ``tool_call_id`` and ``name``; ``tools`` as ``{"type": "function",
"function": {...}}``), with the adaptations llama.cpp and vLLM make for templates
that need them, each decided by what the template was found to render
(``Caps``, ``service.chat.caps``):

* arguments as a JSON object when the template renders objects (most do), else
  as the caller's text;
* no tools rendered: the server's description in the system turn
  (``service.chat.fallback``); no calls rendered: the calls in the assistant's
  text, in the family's syntax; no tool role: results as user turns (adjacent
  ones joined); one call per turn only (Llama 3.x): a turn of several calls
  becomes one turn per call, each followed by its result; no system role: the
  system text starts the first user turn;
* the family's call ids (``Family.call_id``), extra variables and the field of
  an earlier thought (``Family.thought_key``).

Every string a caller wrote passes through ``esc`` (``ControlTokens.escape``), so
that none becomes a control token; the server's own wording and the family's
markers do not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.chat.calls import Function, ToolCall
from service.chat.fallback import result_text, tools_text
from service.chat.families import Family
from service.chat.syntax import deep

Esc = Callable[[str], str]
Json = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Turn:
    """One message: ``calls`` (assistant), ``call_id`` and ``name`` (tool: the call answered, its function)."""

    role: str
    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    call_id: str = ""
    name: str = ""
    reasoning: str = ""  # assistant: its thought, the template's ``reasoning_content`` or its family's field


@dataclass(frozen=True)
class Conversation:
    """The turns, the tools offered, and template variables (``enable_thinking``, ``reasoning_effort``, ...)."""

    turns: Sequence[Turn]
    tools: Sequence[Function] = ()
    variables: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Caps:
    """What a chat template renders (found by ``service.chat.caps.probe``)."""

    system: bool = True  # a system turn
    tools: bool = False  # the tools offered
    calls: bool = False  # an assistant turn's calls
    object_args: bool = True  # calls' arguments given as objects (else as JSON text)
    results: bool = False  # tool messages
    multi_calls: bool = False  # several calls in one assistant turn
    empty_tools: bool = False  # no tools offered: ``tools`` is [] (the template iterates it unchecked), not None

    def summary(self) -> str:
        return ",".join(k for k, v in vars(self).items() if v is True)


@dataclass(frozen=True)
class TemplateInput:
    messages: list[Json]
    tools: list[Json] | None
    variables: dict[str, Any]


def _arguments(arguments: str, caps: Caps, esc: Esc) -> Any:
    if caps.object_args:
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            return esc(arguments)  # NOTE: history is not re-validated: text that is not JSON stays text
        if isinstance(value, dict):
            return deep(value, esc)
    return esc(arguments)


class Builder:
    """Builds one ``TemplateInput`` (see the module doc)."""

    def __init__(self, family: Family, caps: Caps, esc: Esc) -> None:
        self.family, self.caps, self.esc = family, caps, esc
        self.out: list[Json] = []
        self.folded = False  # the last message is a user turn holding folded results
        self.ids: dict[str, int] = {}

    def _id(self, call_id: str) -> str:
        index = self.ids.setdefault(call_id, len(self.ids))
        return self.esc(self.family.call_id(call_id, index))

    def call(self, c: ToolCall) -> Json:
        fn = {"name": self.esc(c.name), "arguments": _arguments(c.arguments, self.caps, self.esc)}
        return {"id": self._id(c.id), "type": "function", "function": fn}

    def add(self, message: Json, folded: bool = False) -> None:
        if folded and self.folded:
            self.out[-1]["content"] += "\n" + message["content"]
        else:
            self.out.append(message)
        self.folded = folded

    def assistant(self, t: Turn) -> None:
        content = self.esc(t.content)
        # NOTE: Hugging Face's name for an earlier thought (or the family's); a template that does not read it
        # drops it
        thought = {self.family.thought_key: self.esc(t.reasoning)} if t.reasoning else {}
        if not t.calls:
            self.add({"role": "assistant", "content": content, **thought})
        elif not self.caps.calls:
            text = self.family.syntax.render(t.calls, self.esc)
            self.add({"role": "assistant", "content": f"{content}\n{text}" if content else text, **thought})
        else:
            self.add({"role": "assistant", "content": content, "tool_calls": [self.call(c) for c in t.calls],
                      **thought})

    def result(self, t: Turn) -> None:
        if self.caps.results:
            self.add({"role": "tool", "tool_call_id": self._id(t.call_id), "name": self.esc(t.name),
                      "content": self.esc(t.content)})
        else:
            self.add({"role": "user", "content": result_text(self.esc(t.content))}, folded=True)

    def turns(self, turns: Sequence[Turn]) -> None:
        i = 0
        while i < len(turns):
            t = turns[i]
            if t.role == "assistant" and len(t.calls) > 1 and self.caps.calls and not self.caps.multi_calls:
                i = self._one_call_each(turns, i)
                continue
            if t.role == "assistant":
                self.assistant(t)
            elif t.role == "tool":
                self.result(t)
            else:
                self.add({"role": t.role, "content": self.esc(t.content)})
            i += 1

    def _one_call_each(self, turns: Sequence[Turn], i: int) -> int:
        """A turn of several calls and the results after it, as one turn per call, each with its result
        (matched by id, else in order); returns the index after the results."""
        t, j = turns[i], i + 1
        results = []
        while j < len(turns) and turns[j].role == "tool":
            results.append(turns[j])
            j += 1
        for k, c in enumerate(t.calls):
            self.assistant(Turn("assistant", t.content if k == 0 else "", (c,), reasoning=t.reasoning if k == 0 else ""))
            match = next((r for r in results if r.call_id and r.call_id == c.id), None)
            match = match or next((r for r in results if not r.call_id), None) or (results[0] if results else None)
            if match is not None:
                results.remove(match)
                self.result(match)
        for r in results:
            self.result(r)
        return j


def _system_first(messages: list[Json], text: str) -> list[Json]:
    """``text`` at the end of the first system turn, or in a new one first."""
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{text}" if messages[0]["content"] else text)
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _no_system(messages: list[Json]) -> list[Json]:
    """The first system turn's text at the start of the next user turn (a user turn of its own if none)."""
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"], messages[1:]
    if rest and rest[0]["role"] == "user":
        return [dict(rest[0], content=f"{system}\n\n{rest[0]['content']}"), *rest[1:]]
    return [{"role": "user", "content": system}, *rest]


def template_input(conv: Conversation, family: Family, caps: Caps, esc: Esc) -> TemplateInput:
    """What the template renders for ``conv`` (see the module doc)."""
    b = Builder(family, caps, esc)
    b.turns(conv.turns)
    messages = b.out
    tools: list[Json] | None = [] if caps.empty_tools else None
    if conv.tools and caps.tools:
        tools = [{"type": "function", "function": {"name": esc(f.name), "description": esc(f.description),
                                                   "parameters": deep(f.parameters, esc)}} for f in conv.tools]
    elif conv.tools:
        messages = _system_first(messages, tools_text(conv.tools, family.syntax, esc))
    if not caps.system:
        messages = _no_system(messages)
    variables = {k: deep(v, esc) for k, v in conv.variables.items()}
    if family.variables is not None:
        variables.update(family.variables(tools or []))
    return TemplateInput(messages, tools, variables)
