"""OpenAI Responses bodies (stateless) -> the chat request every dialect shares (``service.http.chat_request``).

``POST /v1/responses`` (docs/http-apis.md):

* ``input``: a string (one user turn) or input items: messages (roles
  ``system``, ``developer``, ``user``, ``assistant``; content a string or
  ``input_text`` / ``output_text`` / ``refusal`` parts), ``function_call`` (the
  assistant's earlier call, a ``tool_calls`` entry of its turn, as the chat
  route takes it) and ``function_call_output`` (a ``tool`` turn); a
  ``reasoning`` item's ``reasoning_text`` is the thought of the assistant turn
  it joins (``ChatMessage.reasoning_content``: passed back by templates that
  render earlier thoughts), an item without any is dropped. Images, files and audio, item
  references and hosted tools' items are a 400 naming the item. Fields of an
  item the server does not need (``id``, ``status``, annotations) are ignored,
  so an earlier response's output can be sent back as it came;
* ``instructions`` (a system turn first), ``tools`` (function tools; hosted
  tools are a 400 naming their type), ``tool_choice``, ``text.format``
  (``text``, ``json_object``, ``json_schema``), ``max_output_tokens``,
  ``temperature``, ``top_p``, ``service_tier``, ``stream``, and the extension
  ``ignore_eos`` (as the chat route takes it);
* stateless: nothing is stored. ``store`` unset or false is served (the SDKs
  send it only when it is set); ``store: true``, ``previous_response_id``,
  ``conversation``, ``background: true`` and stored ``prompt``s are a 400;
* ``parallel_tool_calls`` (default true: several calls in one answer where the
  model's family writes several);
* ``reasoning.effort``: the template variable ``reasoning_effort`` (``"none"``
  turns a reasoning model's thinking off), and the extension
  ``thinking_budget_tokens`` (as the chat route takes it); a reasoning model's
  thought is the answer's ``reasoning`` item (``service.http.responses_stream``);
* accepted and ignored: ``reasoning.summary`` (no summaries), ``max_tool_calls``,
  ``metadata`` and ``user`` (echoed), ``safety_identifier``, ``prompt_cache_key``,
  ``prompt_cache_retention`` (prefix caching is automatic), ``truncation``
  (nothing is truncated: an input over the context is a 400), ``include``
  (``reasoning.encrypted_content`` only: there is none; the item's is null), ``top_logprobs`` 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.http import sampling
from service.http.body import Body, JsonObject
from service.http.chat_request import JSON_OBJECT, Format, chat_request, json_schema, template_kwargs
from service.http.errors import bad_param
from service.http.reasoning import BUDGET, budget_of
from service.http.render import Json
from service.http.requests import EFFORTS, Output, Parsed
from service.http.tools import ToolPlan, check_tool_count, function, plan_functions

IGNORED = ("reasoning", "max_tool_calls", "metadata", "user", "safety_identifier",
           "prompt_cache_key", "prompt_cache_retention", "truncation", "include", "top_logprobs", "stream_options")
REFUSED = {"previous_response_id": "this server is stateless: send the whole conversation as input",
           "conversation": "this server is stateless: send the whole conversation as input",
           "prompt": "stored prompts are not supported", "context_management": "not supported"}
KNOWN = (BUDGET, "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
         "max_output_tokens", "temperature", "top_p", "store", "stream", "service_tier", "background", "ignore_eos",
         *IGNORED, *REFUSED)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


@dataclass(frozen=True)
class ResponsesParsed(Parsed):
    """The request, and the parameters the ``response`` object echoes."""

    echo: Json = field(default_factory=dict)


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_param(f"{where}.content", f"{where}.content must be a string or an array of content parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None or not isinstance(part.get(key), str):
            raise bad_param(f"{where}.content[{j}]", f"{where}.content[{j}]: only text parts are supported by this "
                                                     f"server (a text-only model), got {kind!r}")
        out.append(part[key])
    return "".join(out)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _item(i: int, item: Any, names: dict[str, str]) -> pb.ChatMessage | None:
    """One input item as a turn (None: dropped); an assistant's ``function_call`` is a turn of one call."""
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise bad_param(where, f"{where} must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        if item.get("role") not in ROLES:
            raise bad_param(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}")
        return pb.ChatMessage(role=ROLES[item["role"]], content=_content(item.get("content"), where))
    if kind == "function_call":
        if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments"), str):
            raise bad_param(where, f"{where}: a function_call needs name and arguments (strings)")
        cid = _str(item.get("call_id"))
        names[cid] = item["name"]
        call = pb.ToolCall(id=cid, name=item["name"], arguments=item["arguments"])
        return pb.ChatMessage(role="assistant", tool_calls=[call])
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _content(output, where + ".output")
        cid = _str(item.get("call_id"))
        return pb.ChatMessage(role="tool", content=text, tool_call_id=cid, name=names.get(cid, ""))
    if kind == "reasoning":
        return _thought(item, where)
    if kind == "item_reference":
        raise bad_param(where, f"{where}: item references need stored items; this server is stateless")
    raise bad_param(f"{where}.type", f"{where}: input items of type {kind!r} are not supported by this server")


def _thought(item: Json, where: str) -> pb.ChatMessage | None:
    """A ``reasoning`` item as the thought of the assistant turn it joins (its ``reasoning_text`` parts; an
    item with none, e.g. another server's encrypted one, is dropped)."""
    parts = item.get("content")
    if parts is None:
        return None
    if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts):
        raise bad_param(f"{where}.content", f"{where}.content must be an array of reasoning_text parts")
    text = "".join(p["text"] for p in parts if p.get("type") == "reasoning_text")
    return pb.ChatMessage(role="assistant", reasoning_content=text) if text else None


def _turns(body: Body, limits: InputLimits) -> list[pb.ChatMessage]:
    """``instructions`` and ``input`` as turns; an assistant item right after another joins its turn."""
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise bad_param("input", "'input' must be a string or a non-empty array of input items")
    if problem := limits.messages(len(raw)):
        raise bad_param("input", problem)
    turns: list[pb.ChatMessage] = []
    if instructions := body.str_("instructions"):
        turns.append(pb.ChatMessage(role="system", content=instructions))
    names: dict[str, str] = {}
    for i, item in enumerate(raw):
        turn = _item(i, item, names)
        if turn is None:
            continue
        if turn.role == "assistant" and turns and turns[-1].role == "assistant":
            last = turns[-1]
            text = "\n".join(t for t in (last.content, turn.content) if t)
            turns[-1] = pb.ChatMessage(role="assistant", content=text, tool_calls=[*last.tool_calls, *turn.tool_calls],
                                       reasoning_content=last.reasoning_content + turn.reasoning_content)
        else:
            turns.append(turn)
    return turns


def _tool(i: int, tool: Any) -> Any:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_param(where, f"{where} must be an object")
    if tool.get("type") != "function":
        raise bad_param(f"{where}.type", f"tool type {tool.get('type')!r} is not supported by this server: only "
                                         "function tools")
    Body(tool, ("type", "name", "description", "parameters", "strict"), where + ".")
    return function(tool.get("name"), tool.get("parameters"), tool.get("description"), f"{where}.name",
                    f"{where}.parameters")


def _choice(choice: Any) -> tuple[str, str]:
    """(mode, named function) of ``tool_choice``."""
    if choice is None or choice in ("auto", "required", "none"):
        return choice or "auto", ""
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return "named", choice["name"]
    raise bad_param("tool_choice", "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
                                   "'name': ...} (hosted tools and allowed_tools are not supported)")


def _tools(body: Body, limits: InputLimits) -> ToolPlan | None:
    tools = body.list_("tools") or []
    check_tool_count(len(tools), limits)
    mode, named = _choice(body.get("tool_choice"))
    parallel = body.bool_("parallel_tool_calls")
    if not tools:
        if mode not in ("auto", "none"):
            raise bad_param("tool_choice", "tool_choice needs tools")
        return None
    return plan_functions([_tool(i, t) for i, t in enumerate(tools)], mode, named, parallel is not False,
                          "tools[{}].parameters")


def _format(body: Body) -> Format | None:
    text = body.obj("text", ("format", "verbosity"))
    if text is None:
        return None
    if text.has("verbosity"):
        raise bad_param("text.verbosity", "text.verbosity is not supported by this server")
    fmt = text.obj("format", ("type", "name", "schema", "description", "strict"))
    kind = fmt.str_("type", required=True) if fmt is not None else "text"
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind != "json_schema":
        raise bad_param("text.format.type", "text.format.type must be text, json_object or json_schema")
    fmt.str_("name", required=True)
    fmt.str_("description")
    fmt.bool_("strict")  # NOTE: strict or not, the output is always constrained and validated
    return json_schema(fmt.get("schema"), "text.format.schema")


def _stateless(body: Body) -> None:
    for name, why in REFUSED.items():
        if body.has(name):
            raise bad_param(name, f"{name} is not supported by this server: {why}")
    if body.bool_("store"):
        raise bad_param("store", "store: true is not supported: this server is stateless and keeps no responses "
                                 "(leave store unset or false)")
    if body.bool_("background"):
        raise bad_param("background", "background responses are not supported by this server")


def _ignored(body: Body, stream: bool) -> None:
    """The accepted-and-ignored parameters, type-checked."""
    reasoning = body.obj("reasoning", ("effort", "summary", "generate_summary"))
    if reasoning is not None:
        reasoning.str_("summary"), reasoning.str_("generate_summary")
    body.int_("max_tool_calls", 1, 1 << 30)
    if (metadata := body.get("metadata")) is not None and not isinstance(metadata, dict):
        raise bad_param("metadata", "'metadata' must be an object of strings")
    for name in ("user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention"):
        body.str_(name)
    if body.str_("truncation") not in (None, "auto", "disabled"):
        raise bad_param("truncation", "truncation must be auto or disabled")
    include = body.list_("include") or []
    if any(x != "reasoning.encrypted_content" for x in include):
        raise bad_param("include", "include: only reasoning.encrypted_content is accepted (there is none here)")
    if body.int_("top_logprobs", 0, 20):
        raise bad_param("top_logprobs", "top_logprobs is not supported by the Responses API here (use chat)")
    options = body.obj("stream_options", ("include_obfuscation",))
    if options is not None and not stream:
        raise bad_param("stream_options", "stream_options is only allowed when stream is true")


def _effort(body: Body) -> dict[str, Any]:
    """``reasoning.effort`` as the template variable ``reasoning_effort`` (as the chat route's ``reasoning_effort``;
    ``"none"`` also turns thinking off: service.http.reasoning)."""
    reasoning = body.obj("reasoning", ("effort", "summary", "generate_summary"))
    effort = reasoning.str_("effort") if reasoning is not None else None
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise bad_param("reasoning.effort", f"reasoning.effort must be one of {', '.join(EFFORTS)}")
    return {"reasoning_effort": effort}


def _echo(raw: JsonObject, body: Body) -> Json:
    """What the ``response`` object repeats of the request."""
    fmt = (raw.get("text") or {}).get("format") or {"type": "text"}
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {}, "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
            "temperature": body.get("temperature"), "top_p": body.get("top_p"), "text": {"format": fmt},
            "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
            "truncation": body.get("truncation") or "disabled", "user": body.get("user")}


def parse_responses(
    raw: JsonObject, model: str, priority_header: str | None, limits: InputLimits = DEFAULTS
) -> ResponsesParsed:
    """A ``POST /v1/responses`` body; raises ApiError 400 naming the first bad parameter."""
    body = Body(raw, KNOWN)
    body.str_("model", required=True)
    _stateless(body)
    stream = bool(body.bool_("stream"))
    _ignored(body, stream)
    turns, plan = _turns(body, limits), _tools(body, limits)
    same = {"temperature": body.num("temperature", 0.0, 2.0), "top_p": body.num("top_p", 0.0, 1.0),
            "max_tokens": body.int_("max_output_tokens", 1, 1 << 30), "service_tier": body.str_("service_tier"),
            "ignore_eos": body.bool_("ignore_eos")}
    shared = Body(same, sampling.SHARED)
    sp = sampling.sampling_params(shared, sampling.max_tokens(shared, None), limits)
    req, schema = chat_request(turns, sp, sampling.priority(shared, priority_header), plan, _format(body),
                               "text.format")
    req.chat_template_kwargs = template_kwargs(_effort(body))
    if (budget := budget_of(body.get(BUDGET))) is not None:
        req.sampling.thinking_budget_tokens = budget
    output = Output(True, model, stream, schema=schema, schema_param="text.format", tools=plan)
    return ResponsesParsed(req, output, echo=_echo(raw, body))
