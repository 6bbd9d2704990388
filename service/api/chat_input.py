"""A request's chat as protos -> the ``Conversation`` the chat template renders; every problem a BadRequest.

``ChatMessage`` turns (with an assistant's ``tool_calls``, a tool result's
``tool_call_id`` and ``name``), ``GenerateRequest.tools`` (each function's
``parameters`` a JSON Schema as text) and ``chat_template_kwargs`` (a JSON object
of further template variables). Counts are checked before the work that grows
with them; ``chars`` bounds the text of everything a template renders, for the
size check made before rendering.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import jsonschema
from inference.v1 import inference_pb2 as pb

from service.api.input_limits import InputLimits
from service.chat.calls import Function, ToolCall
from service.chat.conversation import Conversation, Turn
from service.request.errors import BadRequest
from service.request.strict_json import unique_keys

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# The variables the server itself gives every template (Hugging Face's, and the conversation's own).
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                      "strftime_now"})
MAX_KWARGS_BYTES = 16384


def chars(messages: Sequence[pb.ChatMessage], tools: Sequence[pb.Tool], kwargs: str) -> int:
    """The characters of every string the template may render (a bound for the size check)."""
    n = len(kwargs)
    for m in messages:
        n += len(m.content) + len(m.tool_call_id) + len(m.name) + len(m.reasoning_content)
        n += sum(len(c.id) + len(c.name) + len(c.arguments) for c in m.tool_calls)
    return n + sum(len(t.name) + len(t.description) + len(t.parameters) for t in tools)


def _turn(i: int, m: pb.ChatMessage) -> Turn:
    if m.tool_calls and m.role != "assistant":
        raise BadRequest(f"messages[{i}].tool_calls: only assistant turns make calls")
    if m.reasoning_content and m.role != "assistant":
        raise BadRequest(f"messages[{i}].reasoning_content: only assistant turns have thoughts")
    calls = tuple(ToolCall(c.name, c.arguments, c.id) for c in m.tool_calls)
    for j, c in enumerate(calls):
        if not NAME.match(c.name):
            raise BadRequest(f"messages[{i}].tool_calls[{j}].name must be 1-64 characters of a-z, A-Z, 0-9, _ and -")
    return Turn(m.role, m.content, calls, m.tool_call_id, m.name, m.reasoning_content)


def _function(i: int, t: pb.Tool) -> Function:
    if not NAME.match(t.name):
        raise BadRequest(f"tools[{i}].name must be 1-64 characters of a-z, A-Z, 0-9, _ and -")
    params: Any = {"type": "object", "properties": {}}
    if t.parameters:
        try:
            params = json.loads(t.parameters, object_pairs_hook=unique_keys)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"tools[{i}].parameters is not JSON: {str(exc)[:200]}") from None
    if not isinstance(params, dict):
        raise BadRequest(f"tools[{i}].parameters must be a JSON Schema object")
    try:
        jsonschema.Draft202012Validator.check_schema(params)
    except jsonschema.SchemaError as exc:
        raise BadRequest(f"tools[{i}].parameters is not a valid JSON Schema: {exc.message[:200]}") from None
    return Function(t.name, params, t.description)


def _variables(kwargs: str) -> dict[str, Any]:
    if not kwargs:
        return {}
    if len(kwargs.encode()) > MAX_KWARGS_BYTES:
        raise BadRequest(f"chat_template_kwargs is longer than {MAX_KWARGS_BYTES} bytes")
    try:
        value = json.loads(kwargs, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"chat_template_kwargs is not JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise BadRequest("chat_template_kwargs must be a JSON object")
    for key in value:
        if not VARIABLE.match(key) or key in RESERVED:
            raise BadRequest(f"chat_template_kwargs: {key[:64]!r} is not a template variable a request may set")
    return value


def functions(tools: Sequence[pb.Tool], limits: InputLimits) -> list[Function]:
    """A request's tools as checked functions (their count first, then each one); raises BadRequest."""
    if problem := limits.tools(len(tools)):
        raise BadRequest(problem)
    out = [_function(i, t) for i, t in enumerate(tools)]
    if len({f.name for f in out}) != len(out):
        raise BadRequest("tools: function names must be unique")
    return out


def conversation(messages: Sequence[pb.ChatMessage], tools: Sequence[pb.Tool], kwargs: str,
                 limits: InputLimits) -> Conversation:
    """The conversation of a request's chat fields (see the module doc); raises BadRequest."""
    fns = functions(tools, limits)
    return Conversation([_turn(i, m) for i, m in enumerate(messages)], fns, _variables(kwargs))
