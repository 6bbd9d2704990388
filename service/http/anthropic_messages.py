"""Anthropic Messages bodies -> the chat request every dialect shares (``service.http.chat_request``).

``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (docs/http-apis.md):

* ``system``: a string or text blocks (joined); ``messages``: ``user`` and
  ``assistant`` turns whose ``content`` is a string or blocks: ``text``,
  ``tool_use`` (assistant; an earlier call, rendered by the model's chat
  template), ``tool_result`` (user; a ``tool`` turn answering its call),
  ``thinking`` (the turn's thought: ``ChatMessage.reasoning_content``, passed
  back by templates that render earlier thoughts, dropped by the others; its
  ``signature`` is not checked), ``redacted_thinking`` (dropped). Images, documents and every other block are
  a 400 naming the block;
* ``tools`` (custom tools: ``name``, ``description``, ``input_schema``; server
  tools are a 400 naming their type) and ``tool_choice`` (``auto``, ``any`` =
  the chat route's ``required``, ``tool`` = a named function, ``none``;
  ``disable_parallel_tool_use``): the shared tool plan, so every call is
  generated under its schema;
* ``max_tokens`` (required), ``stop_sequences``, ``temperature`` (0-1),
  ``top_p``, ``top_k``, ``stream``; ``output_config.format`` (a JSON Schema:
  constrained and validated as ``response_format`` is);
* the extension ``ignore_eos`` (as the chat route takes it);
* accepted and ignored: ``metadata``, ``service_tier``, ``cache_control``
  (prefix caching is automatic), ``output_config.effort``;
* ``thinking``: for a reasoning model (``service.http.reasoning``) ``enabled``
  sets ``enable_thinking`` and its ``budget_tokens`` as the thinking budget,
  ``adaptive`` thinking without a budget, ``disabled`` turns it off where the
  template can; absent, the template's default. The thought is the answer's
  ``thinking`` block (``service.http.anthropic_stream``).

Every bad field is an ApiError 400 naming it (Anthropic's error shape is
applied by the route, ``service.http.anthropic_errors``).
"""

from __future__ import annotations

import json
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.http import sampling
from service.http.body import Body, JsonObject
from service.http.chat_request import Format, chat_request, json_schema, template_kwargs
from service.http.errors import bad_param
from service.http.requests import Output, Parsed
from service.http.tools import ToolPlan, check_tool_count, function, plan_functions

COUNT = ("model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "cache_control")
CREATE = (*COUNT, "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "metadata", "stream",
          "service_tier", "ignore_eos")
REFUSED = {"container": "there are no code-execution containers here",
           "mcp_servers": "there is no MCP connector here", "context_management": "context editing is not supported"}
TOOL_KEYS = ("name", "description", "input_schema", "type", "cache_control", "strict")
CHOICES = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
THINKING = ("enabled", "disabled", "adaptive")
MIN_THINKING_BUDGET = 1024


def _text_blocks(value: Any, where: str) -> str:
    """A string, or text blocks joined (``cache_control`` and ``citations`` ignored)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_param(where, f"'{where}' must be a string or an array of text blocks")
    out = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else None
            raise bad_param(f"{where}[{j}]", f"{where}[{j}]: only text blocks are supported here, got {kind!r}")
        out.append(block["text"])
    return "".join(out)


Block = tuple[str, Any]  # ("text" | "thought", str) | ("call", pb.ToolCall) | ("result", pb.ChatMessage) | ("", None)


def _block(block: Any, where: str, role: str, names: dict[str, str]) -> Block:
    """(kind, value) of one content block: kind "text", "call", "result" or "" (dropped)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return "text", block["text"]
    if kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
        return "thought", block["thinking"]  # NOTE: the signature is not checked: this server gives none
    if kind == "redacted_thinking" and role == "assistant":
        return "", None  # NOTE: encrypted by another server: nothing to pass back
    if kind == "tool_use" and role == "assistant":
        if not isinstance(block.get("name"), str) or not isinstance(block.get("input"), dict):
            raise bad_param(where, f"{where}: a tool_use block needs name and an input object")
        cid = block.get("id") if isinstance(block.get("id"), str) else ""
        names[cid] = block["name"]
        return "call", pb.ToolCall(id=cid, name=block["name"], arguments=json.dumps(block["input"]))
    if kind == "tool_result" and role == "user":
        text = "" if block.get("content") is None else _text_blocks(block["content"], f"{where}.content")
        cid = block.get("tool_use_id") if isinstance(block.get("tool_use_id"), str) else ""
        content = f"error: {text}" if block.get("is_error") is True else text
        return "result", pb.ChatMessage(role="tool", content=content, tool_call_id=cid, name=names.get(cid, ""))
    if kind in ("image", "document"):
        raise bad_param(where, f"{where}: {kind} blocks are not supported by this server (a text-only model)")
    raise bad_param(where, f"{where}: {kind!r} blocks are not supported in {role} messages by this server")


def _message(i: int, m: Any, names: dict[str, str]) -> list[pb.ChatMessage]:
    """One message's turns: a user message's results (tool turns) first, then its text."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_param(where, f"{where} must be an object")
    Body(m, ("role", "content"), where + ".")
    role = m.get("role")
    if role not in ("user", "assistant"):
        raise bad_param(f"{where}.role", f"{where}.role must be user or assistant (system is a top-level field)")
    content = m.get("content")
    if isinstance(content, str):
        return [pb.ChatMessage(role=role, content=content)]
    if not isinstance(content, list):
        raise bad_param(f"{where}.content", f"{where}.content must be a string or an array of content blocks")
    blocks = [_block(b, f"{where}.content[{j}]", role, names) for j, b in enumerate(content)]
    text = "".join(v for kind, v in blocks if kind == "text")
    thought = "".join(v for kind, v in blocks if kind == "thought")
    calls = [v for kind, v in blocks if kind == "call"]
    out = [v for kind, v in blocks if kind == "result"]
    if text or calls or thought or not blocks:
        out.append(pb.ChatMessage(role=role, content=text, tool_calls=calls, reasoning_content=thought))
    return out


def _turns(body: Body, limits: InputLimits) -> list[pb.ChatMessage]:
    raw = body.list_("messages")
    if not raw:
        raise bad_param("messages", "'messages' must be a non-empty array")
    if problem := limits.messages(len(raw)):
        raise bad_param("messages", problem)
    names: dict[str, str] = {}
    turns = [t for i, m in enumerate(raw) for t in _message(i, m, names)]
    if (system := body.get("system")) is not None and (text := _text_blocks(system, "system")):
        turns.insert(0, pb.ChatMessage(role="system", content=text))
    return turns


def _tool(i: int, tool: Any) -> Any:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_param(where, f"{where} must be an object")
    if tool.get("type") not in (None, "custom"):
        raise bad_param(f"{where}.type", f"server tool {tool['type']!r} is not supported by this server: only custom "
                                         "tools (name, description, input_schema)")
    Body(tool, TOOL_KEYS, where + ".")
    if tool.get("input_schema") is None:
        raise bad_param(f"{where}.input_schema", f"'{where}.input_schema' is a required property")
    return function(tool.get("name"), tool["input_schema"], tool.get("description"), f"{where}.name",
                    f"{where}.input_schema")


def _tools(body: Body, limits: InputLimits) -> ToolPlan | None:
    tools = body.list_("tools") or []
    check_tool_count(len(tools), limits)
    choice = body.obj("tool_choice", ("type", "name", "disable_parallel_tool_use"))
    kind = choice.str_("type", required=True) if choice is not None else "auto"
    if kind not in CHOICES:
        raise bad_param("tool_choice.type", "tool_choice.type must be auto, any, tool or none")
    assert kind is not None
    named = (choice.str_("name", required=True) or "") if choice is not None and kind == "tool" else ""
    single = choice.bool_("disable_parallel_tool_use") if choice is not None else None
    if not tools:
        if kind not in ("auto", "none"):
            raise bad_param("tool_choice", "tool_choice needs tools")
        return None
    return plan_functions([_tool(i, t) for i, t in enumerate(tools)], CHOICES[kind], named, single is not True,
                          "tools[{}].input_schema")


def _thinking(body: Body, max_tokens: int | None) -> tuple[bool, int | None] | None:
    """The ``thinking`` config as (thinking on, its budget in tokens), None when absent (the template's own
    default): ``enabled`` with its ``budget_tokens``, ``adaptive`` without a budget, ``disabled`` a budget of
    0 (off, where the template can turn it off; service.http.reasoning). ``display`` is checked: the thought
    is always shown."""
    thinking = body.obj("thinking", ("type", "budget_tokens", "display"))
    if thinking is None:
        return None
    kind = thinking.str_("type", required=True)
    if kind not in THINKING:
        raise bad_param("thinking.type", f"thinking.type must be one of {', '.join(THINKING)}")
    if (display := thinking.str_("display")) not in (None, "summarized", "omitted"):
        raise bad_param("thinking.display", f"thinking.display must be summarized or omitted, got {display!r}")
    budget = thinking.int_("budget_tokens", MIN_THINKING_BUDGET, 1 << 30)
    if kind == "enabled" and budget is None:
        raise bad_param("thinking.budget_tokens", "'thinking.budget_tokens' is required with type enabled")
    if budget is not None and max_tokens is not None and budget >= max_tokens:
        raise bad_param("thinking.budget_tokens", "thinking.budget_tokens must be less than max_tokens")
    if kind == "disabled":
        return False, 0
    return True, budget if kind == "enabled" else None


def _format(body: Body) -> Format | None:
    config = body.obj("output_config", ("effort", "format"))
    if config is None:
        return None
    config.str_("effort")  # NOTE: accepted and ignored
    fmt = config.obj("format", ("type", "schema"))
    if fmt is None:
        return None
    if fmt.str_("type", required=True) != "json_schema":
        raise bad_param("output_config.format.type", "output_config.format.type must be json_schema")
    return json_schema(fmt.get("schema"), "output_config.format.schema")


def _sampling(body: Body, max_tokens: int, limits: InputLimits) -> pb.SamplingParams:
    """The shared sampling fields under their Chat Completions names (checked here under Anthropic's)."""
    stops = body.list_("stop_sequences") or []
    if not all(isinstance(s, str) for s in stops):
        raise bad_param("stop_sequences", "'stop_sequences' must be an array of strings")
    same = {"stop": stops, "temperature": body.num("temperature", 0.0, 1.0), "top_p": body.num("top_p", 0.0, 1.0),
            "top_k": body.int_("top_k", 0, 1 << 30), "ignore_eos": body.bool_("ignore_eos")}
    return sampling.sampling_params(Body(same, sampling.SHARED), max_tokens, limits)


def _common(
    raw: JsonObject, known: tuple[str, ...], limits: InputLimits
) -> tuple[Body, list[pb.ChatMessage], ToolPlan | None]:
    for name, why in REFUSED.items():
        if raw.get(name) is not None:
            raise bad_param(name, f"{name} is not supported by this server: {why}")
    body = Body(raw, (*known, *REFUSED))
    body.str_("model", required=True)
    body.obj("cache_control", ("type", "ttl"))  # NOTE: accepted and ignored: prefix caching is automatic
    return body, _turns(body, limits), _tools(body, limits)


def parse_messages(raw: JsonObject, model: str, priority_header: str | None, limits: InputLimits = DEFAULTS) -> Parsed:
    """A ``POST /v1/messages`` body; raises ApiError 400 naming the first bad field."""
    body, turns, plan = _common(raw, CREATE, limits)
    max_tokens = body.int_("max_tokens", 1, 1 << 30)
    if max_tokens is None:
        raise bad_param("max_tokens", "'max_tokens' is a required property")
    thinking = _thinking(body, max_tokens)
    body.obj("metadata", ("user_id",))
    body.str_("service_tier")
    sp = _sampling(body, max_tokens, limits)
    priority = sampling.priority(Body({}, ()), priority_header)
    req, schema = chat_request(turns, sp, priority, plan, _format(body), "output_config.format")
    req.chat_template_kwargs = _variables(thinking)
    if thinking is not None and thinking[1] is not None:
        req.sampling.thinking_budget_tokens = thinking[1]
    output = Output(True, model, bool(body.bool_("stream")), schema=schema, schema_param="output_config.format",
                    tools=plan)
    return Parsed(req, output)


def _variables(thinking: tuple[bool, int | None] | None) -> str:
    """The template variables of a ``thinking`` config (``enable_thinking``; "" without one)."""
    return template_kwargs({"enable_thinking": thinking[0]}) if thinking is not None else ""


def count_turns(raw: JsonObject, limits: InputLimits = DEFAULTS) -> tuple[list[pb.ChatMessage], list[pb.Tool], str]:
    """The turns, tools and template variables a ``POST /v1/messages/count_tokens`` body renders (the
    ``thinking`` config's ``enable_thinking``, as ``parse_messages`` sets it); raises ApiError 400."""
    body, turns, plan = _common(raw, COUNT, limits)
    thinking = _thinking(body, None)
    if plan is not None and _format(body) is not None:
        raise bad_param("output_config.format", "output_config.format cannot be combined with tools")
    return turns, plan.protos() if plan is not None else [], _variables(thinking)
