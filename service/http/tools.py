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

The answer is read as it is generated (``CallReader``, over ``service.api.tool_calls``, which the gRPC
servicer shares): text before the calls is
the message's content, each call gets an id (``call_<hex>``) and its arguments
exactly as the model wrote them, validated against the function's schema with
``jsonschema`` at the end, never an invalid call: arguments that break a keyword
the grammar cannot enforce (``pattern``/``format`` in XML-family string values,
``not``, ``uniqueItems``, ...) are a 400 ``invalid_request_error`` with code
``schema_not_enforced`` naming the keyword, where it broke and the tool's
parameters (``param``: ``tools[i].function.parameters``, or the dialect's name for them).
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from service.api import tool_calls
from service.api.input_limits import DEFAULTS, InputLimits
from service.api.tool_calls import CallFailed, ToolPlan
from service.chat.calls import Function
from service.http.errors import ApiError, bad_param
from service.request.events import SCHEMA_NOT_ENFORCED

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}
Json = dict[str, Any]
__all__ = ["CallReader", "ToolPlan", "check_tool_count", "function", "plan_functions", "plan_tools"]


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


def plan_functions(fns: list[Function], mode: str, named: str = "", parallel: bool = True,
                   where: str = "tools[{}].function.parameters") -> ToolPlan | None:
    """The plan of checked functions under ``mode`` ("auto", "required", "named" with ``named``, "none"):
    every dialect's tools end here. None for "none" (the tools are left out of the prompt)."""
    if len({f.name for f in fns}) != len(fns):
        raise bad_param("tools", "function names must be unique")
    if mode == "named" and named not in {f.name for f in fns}:
        raise bad_param("tool_choice", f"tool_choice names {named!r}, which is not one of the tools")
    if mode == "none":
        return None
    return ToolPlan(mode, tuple(fns), named, parallel, where=where)


def invalid(exc: CallFailed, plan: ToolPlan) -> ApiError:
    """The error of an answer that did not read back into valid calls: arguments that broke a schema keyword
    the grammar could not enforce are a 400 naming the keyword and the tool's parameters; output off the
    call syntax is a server bug (500)."""
    if exc.keyword:
        return ApiError(400, str(exc), param=plan.param(exc.tool), code=SCHEMA_NOT_ENFORCED)
    return ApiError(500, f"generated tool call failed validation: {str(exc)[:200]}", type="server_error")


class CallReader(tool_calls.CallReader):
    """``service.api.tool_calls.CallReader`` whose failures are this dialect's errors (ApiError)."""

    def feed(self, text: str) -> tuple[str, list[Json]]:
        try:
            return super().feed(text)
        except CallFailed as exc:
            raise invalid(exc, self.plan) from None

    def close(self, complete: bool) -> tuple[str, list[Json]]:
        try:
            return super().close(complete)
        except CallFailed as exc:
            raise invalid(exc, self.plan) from None
