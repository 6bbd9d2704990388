"""Function calling: ``tools``, ``tool_choice`` and ``parallel_tool_calls`` -> the model's own call syntax.

The model's chat template renders the tools, earlier calls and their results
(``GenerateRequest.tools``, ``ChatMessage.tool_calls``: ``service.chat``); the
answer is generated under a grammar of the model family's call syntax with each
function's ``parameters`` schema (``ToolFormat.grammar``), so every call returned
parses and validates:

* ``"auto"`` (the default with tools): free text until the family's trigger (e.g.
  ``<tool_call>``, ``[TOOL_CALLS]``), then calls only;
* ``"required"``: calls from the first token; a named function
  (``{"type": "function", "function": {"name": ...}}``): one call of that function;
* ``"none"``: the tools are left out of the prompt, the answer is text;
* ``parallel_tool_calls`` (default true): several calls in one answer where the
  family writes several (false: exactly one).

The answer is read as it is generated (``CallReader``): text before the calls is
the message's content, each call gets an id (``call_<hex>``) and its arguments
exactly as the model wrote them, validated against the function's schema with
``jsonschema`` at the end (a failure is a 500, never an invalid call).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.chat.calls import Args, Begin, CallSyntaxError, Content, Function, Piece
from service.chat.reader import Stream
from service.chat.tool_format import ToolFormat
from service.http.errors import ApiError, bad_param

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}
Json = dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    """How a request's tools shape its output; ``fmt``: the model's tool-call format (set by ``with_format``)."""

    mode: str  # "named" | "required" | "auto"
    functions: tuple[Function, ...]
    named: str = ""  # the function of mode "named"
    parallel: bool = True
    fmt: ToolFormat | None = None

    @property
    def allowed(self) -> tuple[Function, ...]:
        """The functions the answer may call."""
        return tuple(f for f in self.functions if f.name == self.named) if self.mode == "named" else self.functions

    @property
    def schemas(self) -> dict[str, dict[str, Any]]:
        return {f.name: f.parameters for f in self.functions}

    def grammar(self) -> str:
        """The Lark grammar of the answer in the model's syntax (a named function: one call of it)."""
        assert self.fmt is not None
        return self.fmt.grammar(self.allowed, self.mode != "auto", self.parallel and self.mode != "named")

    def protos(self) -> list[pb.Tool]:
        """The tools as the chat template is given them."""
        return [pb.Tool(name=f.name, description=f.description, parameters=json.dumps(f.parameters))
                for f in self.functions]


def function(name: Any, params: Any, desc: Any, where_name: str, where_params: str) -> Function:
    """A checked ``Function``; ``where_*`` are the dialect's parameter names for the 400 naming a bad one."""
    if not isinstance(name, str) or not NAME.match(name):
        raise bad_param(where_name, "function names are 1-64 characters of a-z, A-Z, 0-9, _ and -")
    params = EMPTY_PARAMS if params is None else params
    if not isinstance(params, dict):
        raise bad_param(where_params, "parameters must be a JSON Schema object")
    try:
        jsonschema.Draft202012Validator.check_schema(params)
    except jsonschema.SchemaError as exc:
        raise bad_param(where_params, f"parameters is not a valid JSON Schema: {exc.message}") from None
    return Function(name, params, desc if isinstance(desc, str) else "")


def _function(i: int, tool: Any) -> Function:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise bad_param(where, f"{where} must be {{'type': 'function', 'function': {{...}}}} (only function tools)")
    fn = tool["function"]
    return function(fn.get("name"), fn.get("parameters"), fn.get("description"), f"{where}.function.name",
                    f"{where}.function.parameters")


def _choice(choice: Any) -> tuple[str, str]:
    """(mode, named function) of a Chat Completions ``tool_choice``."""
    if choice is None or choice == "auto":
        return "auto", ""
    if choice in ("required", "none"):
        return choice, ""
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        return "named", choice["function"].get("name")
    raise bad_param("tool_choice", "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', ...}")


def plan_tools(tools: list[Any] | None, choice: Any, limits: InputLimits = DEFAULTS,
               parallel: bool = True) -> ToolPlan | None:
    """The plan of a Chat Completions request's ``tools``/``tool_choice``/``parallel_tool_calls``; None when no
    tool is offered. More than ``limits.max_tools`` tools are refused before any schema is checked."""
    if not tools:
        if choice not in (None, "none"):
            raise bad_param("tool_choice", "tool_choice needs tools")
        return None
    check_tool_count(len(tools), limits)
    mode, named = _choice(choice)
    return plan_functions([_function(i, t) for i, t in enumerate(tools)], mode, named, parallel)


def check_tool_count(n: int, limits: InputLimits) -> None:
    """400 naming ``tools`` when a request offers more than ``limits.max_tools`` (before any is parsed)."""
    if problem := limits.tools(n):
        raise bad_param("tools", problem)


def plan_functions(fns: list[Function], mode: str, named: str = "", parallel: bool = True) -> ToolPlan | None:
    """The plan of checked functions under ``mode`` ("auto", "required", "named" with ``named``, "none"):
    every dialect's tools end here. None for "none" (the tools are left out of the prompt)."""
    if len({f.name for f in fns}) != len(fns):
        raise bad_param("tools", "function names must be unique")
    if mode == "named" and named not in {f.name for f in fns}:
        raise bad_param("tool_choice", f"tool_choice names {named!r}, which is not one of the tools")
    if mode == "none":
        return None
    return ToolPlan(mode, tuple(fns), named, parallel)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def invalid(detail: str) -> ApiError:
    return ApiError(500, f"generated tool call failed validation: {detail[:200]}", type="server_error")


@dataclass
class CallReader:
    """One choice's answer read as it is generated: its content and its calls (ids given here), as OpenAI's
    stream deltas (``feed``) and as the final message (``content``, ``calls``)."""

    plan: ToolPlan
    stream: Stream
    content: str = ""
    calls: list[Json] = field(default_factory=list)

    @classmethod
    def of(cls, plan: ToolPlan) -> CallReader:
        assert plan.fmt is not None
        return cls(plan, plan.fmt.stream(plan.allowed))

    def feed(self, text: str) -> tuple[str, list[Json]]:
        """(new content, tool-call deltas) of the next text; raises ApiError 500 for text off the syntax."""
        try:
            return self._pieces(self.stream.feed(text))
        except CallSyntaxError as exc:
            raise invalid(str(exc)) from None

    def close(self, complete: bool) -> tuple[str, list[Json]]:
        """The last content and deltas; ``complete`` (finish "stop"): every call is checked against its
        schema (ApiError 500). A cut-off answer keeps what was read."""
        try:
            out = self._pieces(self.stream.close())
        except CallSyntaxError as exc:
            if complete:
                raise invalid(str(exc)) from None
            return "", []
        if complete:
            self._validate()
        return out

    def _pieces(self, pieces: Sequence[Piece]) -> tuple[str, list[Json]]:
        text, deltas = "", []
        for p in pieces:
            if isinstance(p, Content):
                text += p.text
            elif isinstance(p, Begin):
                self.calls.append({"id": call_id(), "type": "function", "function": {"name": p.name, "arguments": ""}})
                deltas.append({"index": p.index, **json.loads(json.dumps(self.calls[-1]))})
            elif isinstance(p, Args):
                self.calls[p.index]["function"]["arguments"] += p.text
                deltas.append({"index": p.index, "function": {"arguments": p.text}})
        self.content += text
        return text, deltas

    def _validate(self) -> None:
        schemas = self.plan.schemas
        for call in self.calls:
            fn = call["function"]
            try:
                jsonschema.validate(json.loads(fn["arguments"]), schemas[fn["name"]],
                                    cls=jsonschema.Draft202012Validator)
            except (ValueError, KeyError, jsonschema.ValidationError) as exc:
                raise invalid(str(exc)) from None
