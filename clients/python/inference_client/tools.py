"""Function calling: tools and a tool choice in, the model's calls out (``GenerateRequest.tools``).

A tool is a ``pb.Tool``, a flat ``{"name", "description", "parameters"}`` dict or
OpenAI's ``{"type": "function", "function": {...}}`` (``parameters`` a JSON Schema:
a dict or JSON text). ``tool_choice`` is "auto" (the default), "required", "none"
or a function's name (one call of it; also as ``{"name": ...}`` or OpenAI's
``{"type": "function", "function": {"name": ...}}``). The server generates the
answer under a grammar of the model's own call syntax and reads it back: each
:class:`ToolCall` has an id, a function name and its arguments (JSON text, valid
against the function's schema; ``args`` parses them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference.v1 import inference_pb2 as pb

ToolLike = Mapping[str, Any] | pb.Tool
ToolChoiceLike = str | Mapping[str, Any]

_MODES = {"auto": pb.TOOL_CHOICE_AUTO, "required": pb.TOOL_CHOICE_REQUIRED, "none": pb.TOOL_CHOICE_NONE}


@dataclass(frozen=True)
class ToolCall:
    """One function call the model made: ``arguments`` is a JSON object as text."""

    id: str
    name: str
    arguments: str

    @property
    def args(self) -> Any:
        """The arguments, parsed."""
        return json.loads(self.arguments)

    def to_proto(self) -> pb.ToolCall:
        return pb.ToolCall(id=self.id, name=self.name, arguments=self.arguments)


def tool_proto(tool: ToolLike) -> pb.Tool:
    """A tool in any accepted shape (see the module docstring) as its proto."""
    if isinstance(tool, pb.Tool):
        return tool
    fn = tool.get("function", tool) if tool.get("type") == "function" else tool
    params = fn.get("parameters")
    text = "" if params is None else params if isinstance(params, str) else json.dumps(params)
    return pb.Tool(name=fn["name"], description=fn.get("description") or "", parameters=text)


def tool_protos(tools: Sequence[ToolLike] | None) -> list[pb.Tool]:
    return [tool_proto(t) for t in tools or ()]


def tool_choice_fields(choice: ToolChoiceLike | None) -> dict[str, Any]:
    """``tool_choice`` (and ``tool_choice_function``) of a request; {} for None (the server's "auto")."""
    if choice is None:
        return {}
    if isinstance(choice, Mapping):
        fn = choice.get("function", choice) if choice.get("type") == "function" else choice
        return {"tool_choice": pb.TOOL_CHOICE_FUNCTION, "tool_choice_function": fn["name"]}
    if choice in _MODES:
        return {"tool_choice": _MODES[choice]}
    return {"tool_choice": pb.TOOL_CHOICE_FUNCTION, "tool_choice_function": choice}


def call_proto(call: ToolCall | Mapping[str, Any] | pb.ToolCall) -> pb.ToolCall:
    """An earlier call of an assistant turn: a ToolCall, its proto, or OpenAI's ``{"id", "function": {...}}``."""
    if isinstance(call, pb.ToolCall):
        return call
    if isinstance(call, ToolCall):
        return call.to_proto()
    fn = call.get("function", call)
    args = fn.get("arguments", "{}")
    return pb.ToolCall(id=call.get("id", ""), name=fn["name"], arguments=args if isinstance(args, str)
                       else json.dumps(args))


def calls_from_proto(calls: Sequence[pb.ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(c.id, c.name, c.arguments) for c in calls)
