"""Chat Completions and Completions bodies -> one ``inference.v1.GenerateRequest`` and its output plan.

The HTTP API builds the same proto a gRPC client would send, so the intake
validates, caches and schedules both alike (a chat request and the equal
``Generate`` request share the response cache). ``Output`` keeps what the
proto cannot carry: streaming options, the logprobs style, tool calls, the
schema to validate the final document against, and the echoed prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.http import sampling
from service.http.body import Body, JsonObject
from service.http.chat_request import JSON_OBJECT, Format, chat_request, json_schema
from service.http.errors import bad_param
from service.http.messages import chat_messages
from service.http.tools import ToolPlan, plan_tools

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
CHAT = (*sampling.SHARED, "messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
        "tools", "tool_choice", "modalities", "stop")
COMPLETION = (*sampling.SHARED, "prompt", "echo", "logprobs", "best_of", "suffix")
REFUSED = {  # OpenAI parameters with no meaning here: a 400 naming them (docs/openai.md)
    "functions": "use tools", "function_call": "use tool_choice", "audio": "this model has no audio output",
    "prediction": "predicted outputs are not supported", "web_search_options": "no web search here",
    "reasoning_effort": "this model does not reason", "verbosity": "not supported",
}


@dataclass(frozen=True)
class Output:
    """How a request's events become OpenAI objects."""

    chat: bool
    model: str
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # None: no logprobs; chat: top_logprobs; completions: the logprobs integer
    schema: str | None = None  # JSON Schema the final document must validate against (finish stop)
    tools: ToolPlan | None = None
    echo: str = ""  # completions: the prompt, put before the text


@dataclass(frozen=True)
class Parsed:
    request: pb.GenerateRequest  # request_id is set by the caller
    output: Output


def _refuse(raw: JsonObject) -> None:
    for name, why in REFUSED.items():
        if raw.get(name) is not None:
            raise bad_param(name, f"{name} is not supported by this server: {why}")


def _response_format(body: Body) -> Format | None:
    """The JSON format of ``response_format`` (None: text)."""
    rf = body.obj("response_format", ("type", "json_schema"))
    if rf is None or rf.str_("type") == "text":
        return None
    kind = rf.str_("type", required=True)
    if kind == "json_object":
        return JSON_OBJECT
    if kind != "json_schema":
        raise bad_param("response_format.type", "response_format.type must be text, json_object or json_schema")
    spec = rf.obj("json_schema", ("name", "description", "schema", "strict"))
    if spec is None:
        raise bad_param("response_format.json_schema", "response_format.json_schema is required")
    spec.str_("name", required=True)
    spec.str_("description")
    spec.bool_("strict")  # NOTE: strict or not, the output is always constrained and validated
    return json_schema(spec.get("schema"), "response_format.json_schema.schema")


def _chat_logprobs(body: Body) -> int | None:
    on = body.bool_("logprobs")
    top = body.int_("top_logprobs", 0, 20)
    if top is not None and not on:
        raise bad_param("top_logprobs", "top_logprobs requires logprobs to be true")
    return (top or 0) if on else None


def parse_chat(raw: JsonObject, model: str, priority_header: str | None, limits: InputLimits = DEFAULTS) -> Parsed:
    """A Chat Completions body; raises ApiError 400 naming the first bad parameter (counts past
    ``limits`` before the work that grows with them)."""
    _refuse(raw)
    body = Body(raw, (*CHAT, *REFUSED))
    body.str_("model", required=True)
    if (mods := body.get("modalities")) is not None and mods != ["text"]:
        raise bad_param("modalities", "only the text modality is supported")
    plan = plan_tools(body.list_("tools"), body.get("tool_choice"), limits)
    fmt = _response_format(body)
    messages = chat_messages(body.get("messages"), limits)
    top = _chat_logprobs(body)
    sp = sampling.sampling_params(body, sampling.max_tokens(body, None), limits)
    sp.logprobs, sp.top_logprobs = top is not None, top or 0
    req, schema = chat_request(messages, sp, sampling.priority(body, priority_header), plan, fmt)
    s = sampling.streaming(body)
    return Parsed(req, Output(True, model, s.stream, s.include_usage, top, schema, plan))


def _prompt(body: Body) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_param(
            "prompt", "prompt must be a string (or an array of one string): token-id and multi-prompt "
            "requests are not supported; send one request per prompt"
        )
    return prompt


def parse_completion(
    raw: JsonObject, model: str, priority_header: str | None, limits: InputLimits = DEFAULTS
) -> Parsed:
    """A (legacy) Completions body; raises ApiError 400 naming the first bad parameter."""
    body = Body(raw, COMPLETION)
    body.str_("model", required=True)
    prompt = _prompt(body)
    if body.str_("suffix"):
        raise bad_param("suffix", "suffix (insertion) is not supported by this server")
    top = body.int_("logprobs", 0, 20)
    echo = bool(body.bool_("echo"))
    if echo and top is not None:
        raise bad_param("echo", "echo with logprobs is not supported by this server")
    sp = sampling.sampling_params(body, sampling.max_tokens(body, COMPLETIONS_DEFAULT_MAX_TOKENS), limits)
    best_of = body.int_("best_of", 1, 1 << 30)
    if best_of is not None and best_of != max(sp.n, 1):
        raise bad_param("best_of", "best_of must equal n: this server returns every choice it generates")
    sp.logprobs, sp.top_logprobs = top is not None, top or 0
    req = pb.GenerateRequest(prompt=prompt, sampling=sp, priority=sampling.priority(body, priority_header))
    s = sampling.streaming(body)
    return Parsed(req, Output(False, model, s.stream, s.include_usage, top, echo=prompt if echo else ""))
