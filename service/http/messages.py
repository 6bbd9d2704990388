"""OpenAI chat messages -> ``inference.v1.ChatMessage`` turns the model's chat template renders.

* roles ``system``/``developer`` (a system turn), ``user``, ``assistant``, ``tool``;
* ``content``: a string, or an array of ``{"type": "text", "text": ...}`` parts
  (joined); other part types (images, audio, files) are a 400 naming the message;
* an assistant message's ``tool_calls`` become ``ChatMessage.tool_calls`` (the
  template renders them in the model's own syntax); a ``tool`` message keeps its
  ``tool_call_id`` and gets the called function's ``name`` from the call it answers;
* an assistant message's ``reasoning_content`` (its thought, as this server
  answers it) becomes ``ChatMessage.reasoning_content``: templates that render
  earlier thoughts pass it back, the others drop it;
* ``name`` of other roles is accepted and ignored.
"""

from __future__ import annotations

from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.http.errors import bad_param

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "reasoning_content"}


def _text(content: Any, where: str, optional: bool) -> str:
    if content is None and optional:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_param(f"{where}.content[{j}]", "only text content parts are supported by this model")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_param(f"{where}.content", "content must be a string or an array of text parts")


def _calls(calls: Any, where: str) -> list[pb.ToolCall]:
    if not isinstance(calls, list):
        raise bad_param(f"{where}.tool_calls", "tool_calls must be an array")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise bad_param(f"{where}.tool_calls[{j}]", "a tool call needs function.name and function.arguments")
        cid = call.get("id")
        out.append(pb.ToolCall(id=cid if isinstance(cid, str) else "", name=fn["name"], arguments=fn["arguments"]))
    return out


def _message(i: int, m: Any, names: dict[str, str]) -> pb.ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_param(where, f"{where} must be an object")
    if unknown := set(m) - KEYS:
        raise bad_param(f"{where}.{sorted(unknown)[0]}", f"Unrecognized message field: {sorted(unknown)[0]}")
    role = m.get("role")
    if role not in ROLES:
        raise bad_param(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}")
    out = pb.ChatMessage(role=ROLES[role], content=_text(m.get("content"), where, optional=role == "assistant"))
    if (thought := m.get("reasoning_content")) is not None:
        if role != "assistant" or not isinstance(thought, str):
            raise bad_param(f"{where}.reasoning_content", "reasoning_content is a string of an assistant message")
        out.reasoning_content = thought
    if role == "assistant" and m.get("tool_calls"):
        out.tool_calls.extend(_calls(m["tool_calls"], where))
        names.update((c.id, c.name) for c in out.tool_calls if c.id)
    if role == "tool":
        cid = m.get("tool_call_id")
        out.tool_call_id = cid if isinstance(cid, str) else ""
        name = m.get("name")
        out.name = names.get(out.tool_call_id, name if isinstance(name, str) else "")
    return out


def chat_messages(raw: Any, limits: InputLimits = DEFAULTS) -> list[pb.ChatMessage]:
    """The request's turns; 400 for a bad message or more than ``limits.max_messages`` of them
    (counted before any is converted)."""
    if not isinstance(raw, list) or not raw:
        raise bad_param("messages", "messages must be a non-empty array")
    if problem := limits.messages(len(raw)):
        raise bad_param("messages", problem)
    names: dict[str, str] = {}
    return [_message(i, m, names) for i, m in enumerate(raw)]
