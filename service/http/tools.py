"""Function calling: ``tools`` and ``tool_choice`` become a prompt section and an output grammar.

Every tool call this server returns was generated under its function's
parameter schema, so its arguments parse and validate:

* a named function (``tool_choice: {"type": "function", "function": {"name": ...}}``):
  the output is the arguments object, constrained by ``parameters`` as a JSON Schema
  (the same path and final validation as ``response_format``);
* ``"required"``: the output is ``{"name": ..., "arguments": {...}}`` under an ``anyOf``
  of one such object per tool;
* ``"auto"`` (the default with tools): a Lark grammar lets the model write either
  free text that does not start with ``<``, or ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
  with the JSON under the same ``anyOf`` (llguidance's ``%json``); a call is then
  validated against its function's schema with ``jsonschema`` before it is returned
  (a failure is a 500, never an invalid call);
* ``"none"``: tools are left out of the prompt, the answer is text.

One call per answer (``parallel_tool_calls`` is accepted and ignored). The
model's chat template only knows system/user/assistant turns, so the tools are
described in the system turn, earlier calls are rendered as
``<tool_call>...</tool_call>`` assistant text and tool results as
``<tool_response>...</tool_response>`` user turns.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import jsonschema

from service.api.input_limits import DEFAULTS, InputLimits
from service.http.errors import ApiError, bad_param

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    """How a request's tools shape its prompt and output."""

    mode: str  # "named" | "required" | "auto"
    schemas: dict[str, dict[str, Any]]  # parameters per function name
    fmt: tuple[str, str]  # ResponseFormat field ("json_schema" / "lark_grammar") and its source
    system_text: str
    named: str = ""  # the function of mode "named"


@dataclass(frozen=True)
class Function:
    """One function tool, whatever the dialect that described it."""

    name: str
    parameters: dict[str, Any]
    description: str = ""


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


def _call_schema(schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    options = [
        {"type": "object", "properties": {"name": {"const": n}, "arguments": p},
         "required": ["name", "arguments"], "additionalProperties": False}
        for n, p in schemas.items()
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _choice(choice: Any) -> tuple[str, str]:
    """(mode, named function) of a Chat Completions ``tool_choice``."""
    if choice is None or choice == "auto":
        return "auto", ""
    if choice in ("required", "none"):
        return choice, ""
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        return "named", choice["function"].get("name")
    raise bad_param("tool_choice", "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', ...}")


def plan_tools(tools: list[Any] | None, choice: Any, limits: InputLimits = DEFAULTS) -> ToolPlan | None:
    """The plan of a Chat Completions request's ``tools``/``tool_choice``; None when no tool is offered.

    More than ``limits.max_tools`` tools are refused before any schema is checked.
    """
    if not tools:
        if choice not in (None, "none"):
            raise bad_param("tool_choice", "tool_choice needs tools")
        return None
    check_tool_count(len(tools), limits)
    mode, named = _choice(choice)
    return plan_functions([_function(i, t) for i, t in enumerate(tools)], mode, named)


def check_tool_count(n: int, limits: InputLimits) -> None:
    """400 naming ``tools`` when a request offers more than ``limits.max_tools`` (before any is parsed)."""
    if problem := limits.tools(n):
        raise bad_param("tools", problem)


def plan_functions(fns: list[Function], mode: str, named: str = "") -> ToolPlan | None:
    """The plan of checked functions under ``mode`` ("auto", "required", "named" with ``named``, "none"):
    every dialect's tools end here. None for "none" (the tools are left out of the prompt)."""
    schemas = {f.name: f.parameters for f in fns}
    if len(schemas) != len(fns):
        raise bad_param("tools", "function names must be unique")
    if mode == "named" and named not in schemas:
        raise bad_param("tool_choice", f"tool_choice names {named!r}, which is not one of the tools")
    if mode == "none":
        return None
    listing = "\n".join(json.dumps({"name": f.name, "description": f.description, "parameters": f.parameters})
                        for f in fns)
    call = json.dumps(_call_schema(schemas))
    if mode == "named":
        fmt = ("json_schema", json.dumps(schemas[named]))
        last = f"Call the function {named} now: answer with its arguments as one JSON object."
    elif mode == "required":
        fmt, last = ("json_schema", call), 'Answer with one call: {"name": ..., "arguments": {...}}.'
    else:
        grammar = f'start: TEXT | "{CALL_OPEN}" call "{CALL_CLOSE}"\ncall: %json {call}\nTEXT: /[^<][\\s\\S]*/\n'
        fmt = ("lark_grammar", grammar)
        last = f'To call a function, answer only {CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{CALL_CLOSE}.'
    text = f"You can call these functions (JSON Schema of the arguments of each):\n<tools>\n{listing}\n</tools>\n{last}"
    return ToolPlan(mode, schemas, fmt, text, named)


def call_text(name: str, arguments: Any) -> str:
    """An earlier call as the assistant text the model would have written (``arguments``: JSON text or a value)."""
    if isinstance(arguments, str):
        # NOTE: else kept as the string it was (history is not re-validated); so is JSON nested past what
        # json can decode or encode again (a RecursionError, issue #35: the client's text is no reason to fail)
        with contextlib.suppress(ValueError, RecursionError):
            return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': json.loads(arguments)})}{CALL_CLOSE}"
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CALL_CLOSE}"


def result_text(text: str) -> str:
    """A tool's result as the user-turn text the model reads."""
    return f"<tool_response>\n{text}\n</tool_response>"


def _call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, separators=(",", ":"))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}


def tool_calls(plan: ToolPlan, text: str) -> list[dict[str, Any]] | None:
    """The OpenAI ``tool_calls`` of a complete (finish_reason stop) output; None: it is plain text.

    Raises ApiError 500 if a call does not validate (the grammar should have made that impossible).
    """
    if plan.mode == "named":
        return [_call(plan.named, text)]
    if plan.mode == "auto":
        if not text.startswith(CALL_OPEN):
            return None
        text = text.removeprefix(CALL_OPEN).removesuffix(CALL_CLOSE)
    try:
        call = json.loads(text)
        params = plan.schemas[call["name"]]
        jsonschema.validate(call["arguments"], params, cls=jsonschema.Draft202012Validator)
    except (ValueError, KeyError, TypeError, jsonschema.ValidationError) as exc:
        raise ApiError(500, f"generated tool call failed validation: {str(exc)[:200]}", type="server_error") from None
    return [_call(call["name"], call["arguments"])]
