"""OpenAI chat messages -> ``inference.v1.ChatMessage`` turns the model's chat template renders.

* roles ``system``/``developer`` (a system turn), ``user``, ``assistant``, ``tool``;
* ``content``: a string, or an array of ``{"type": "text", "text": ...}`` parts
  (joined); other part types (images, audio, files) are a 400 naming the message;
* an assistant message's ``tool_calls`` are rendered as ``<tool_call>{...}</tool_call>``
  text, a ``tool`` message as a user turn ``<tool_response>...</tool_response>``
  (the chat template has no tool roles; see ``service.http.tools``);
* ``name`` is accepted and ignored.

With tools, their description is put in the first system turn by the request
builder all dialects share (``service.http.chat_request``).
"""

from __future__ import annotations

from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.http.errors import bad_param
from service.http.tools import call_text, result_text

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "user"}
KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}


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


def _tool_call_text(calls: Any, where: str) -> str:
    if not isinstance(calls, list):
        raise bad_param(f"{where}.tool_calls", "tool_calls must be an array")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise bad_param(f"{where}.tool_calls[{j}]", "a tool call needs function.name and function.arguments")
        out.append(call_text(fn["name"], fn["arguments"]))
    return "\n".join(out)


def _message(i: int, m: Any) -> pb.ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_param(where, f"{where} must be an object")
    if unknown := set(m) - KEYS:
        raise bad_param(f"{where}.{sorted(unknown)[0]}", f"Unrecognized message field: {sorted(unknown)[0]}")
    role = m.get("role")
    if role not in ROLES:
        raise bad_param(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}")
    calls = m.get("tool_calls") if role == "assistant" else None
    text = _text(m.get("content"), where, optional=role == "assistant")
    if calls:
        text = "\n".join(t for t in (text, _tool_call_text(calls, where)) if t)
    if role == "tool":
        text = result_text(text)
    return pb.ChatMessage(role=ROLES[role], content=text)


def chat_messages(raw: Any, limits: InputLimits = DEFAULTS) -> list[pb.ChatMessage]:
    """The request's turns; 400 for a bad message or more than ``limits.max_messages`` of them
    (counted before any is converted)."""
    if not isinstance(raw, list) or not raw:
        raise bad_param("messages", "messages must be a non-empty array")
    if problem := limits.messages(len(raw)):
        raise bad_param("messages", problem)
    return [_message(i, m) for i, m in enumerate(raw)]
