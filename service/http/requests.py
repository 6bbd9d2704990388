"""Chat Completions and Completions bodies -> one ``inference.v1.GenerateRequest`` and its output plan.

The HTTP API builds the same proto a gRPC client would send, so the intake
validates, caches and schedules both alike (a chat request and the equal
``Generate`` request share the response cache). ``Output`` keeps what the
proto cannot carry: streaming options, the logprobs style, tool calls, the
schema to validate the final document against, and the echoed prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.api.request_builder import MAX_JSON_REPEAT_PENALTY
from service.chat.thought import Reasoning
from service.chat.tool_format import ToolFormat
from service.http import sampling
from service.http.body import Body, JsonObject
from service.http.chat_request import JSON_OBJECT, Format, chat_request, json_schema, template_kwargs
from service.http.errors import bad_param
from service.http.messages import chat_messages
from service.http.prompts import Prompt, check_choices, check_ids, prompts_of, text_of
from service.http.reasoning import BUDGET, StartOf, ThoughtPlan, budget_of, plan
from service.http.tools import ToolPlan, plan_tools

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
JSON_OPTIONS = ("json_finish", "json_repeat_penalty")  # extensions: SamplingParams' fields of the same names
CHAT = (*sampling.SHARED, "messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
        "tools", "tool_choice", "parallel_tool_calls", "modalities", "stop", "reasoning_effort",
        "chat_template_kwargs", BUDGET, *JSON_OPTIONS)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
COMPLETION = (*sampling.SHARED, "prompt", "echo", "logprobs", "best_of", "suffix", *JSON_OPTIONS)
JSON_FINISH = {"close": pb.JSON_FINISH_CLOSE_WITHIN_BUDGET, "cut-off": pb.JSON_FINISH_CUT_OFF}
REFUSED = {  # OpenAI parameters with no meaning here: a 400 naming them (docs/openai.md)
    "functions": "use tools", "function_call": "use tool_choice", "audio": "this model has no audio output",
    "prediction": "predicted outputs are not supported", "web_search_options": "no web search here",
    "verbosity": "not supported",
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
    echo: tuple[str, ...] = ()  # completions with echo: each prompt's text, put before its choices' text
    n: int = 0  # completions: choices per prompt (choice i belongs to prompt i // n); 0: one prompt
    score: bool = False  # completions, echo with logprobs: the prompt's tokens lead each choice's logprobs
    schema_param: str = "response_format"  # the dialect's name of the parameter that gave ``schema``
    thought: ThoughtPlan | None = None  # a reasoning model's chat: its output is read as thought, then answer


@dataclass(frozen=True)
class Parsed:
    """``request`` (its request_id set by the caller) runs once per prompt of ``prompts`` (completions;
    chat: none, the request has its messages), with the prompt put in."""

    request: pb.GenerateRequest
    output: Output
    prompts: tuple[Prompt, ...] = ()


def with_vocab(parsed: Parsed, n_vocab: int, token_bytes: Sequence[bytes]) -> Parsed:
    """Completions: token-id prompts checked against the vocabulary (a 400 naming ``prompt``), and
    echoed as their text."""
    check_ids(parsed.prompts, n_vocab)
    if not parsed.output.echo:
        return parsed
    echo = tuple(text_of(p, token_bytes) for p in parsed.prompts)
    return replace(parsed, output=replace(parsed.output, echo=echo))


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


def _json_options(body: Body, sp: pb.SamplingParams, json_output: bool) -> None:
    """The extensions ``json_finish`` ("close" or "cut-off"; unset: the server's --json-finish) and
    ``json_repeat_penalty`` (0 .. 5) into ``sp``; both need JSON output (a json_schema or json_object
    ``response_format``; tool calls are in the model's own syntax, not a JSON document)."""
    finish = body.str_("json_finish")
    if finish is not None and finish not in JSON_FINISH:
        raise bad_param("json_finish", "json_finish must be 'close' or 'cut-off'")
    penalty = body.num("json_repeat_penalty", 0.0, MAX_JSON_REPEAT_PENALTY)
    if not json_output and (finish == "close" or penalty):
        name = "json_finish" if finish == "close" else "json_repeat_penalty"
        raise bad_param(name, f"{name} needs JSON output: a json_schema or json_object response_format")
    if finish is not None:
        sp.json_finish = JSON_FINISH[finish]
    if penalty is not None:
        sp.json_repeat_penalty = penalty


def with_format(parsed: Parsed, fmt: ToolFormat) -> Parsed:
    """A request with tools, its output generated under the grammar of the model's call syntax (``fmt``)."""
    plan = parsed.output.tools
    if plan is None:
        return parsed
    plan = replace(plan, fmt=fmt)
    parsed.request.response_format.CopyFrom(pb.ResponseFormat(lark_grammar=plan.grammar()))
    return replace(parsed, output=replace(parsed.output, tools=plan))


def with_reasoning(parsed: Parsed, reasoning: Reasoning | None, start_of: StartOf,
                   header: Reasoning | None = None) -> Parsed:
    """A chat request for a reasoning model: its output read as thought and answer, its grammar (budget,
    constraint) after the thought (``service.http.reasoning``); for a model whose answers open with a header
    (``header``), its answer read and written after it; unchanged for other models."""
    thought = plan(parsed.request, reasoning, start_of, header)
    return parsed if thought is None else replace(parsed, output=replace(parsed.output, thought=thought))


def chat_variables(body: Body) -> dict[str, Any]:
    """The template variables of ``chat_template_kwargs`` (an object; llama-server's and vLLM's extension) and
    ``reasoning_effort`` (given to the template as its variable of that name)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad_param("chat_template_kwargs", "chat_template_kwargs must be an object of template variables")
    out = dict(kwargs or {})
    effort = body.str_("reasoning_effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise bad_param("reasoning_effort", f"reasoning_effort must be one of {', '.join(EFFORTS)}")
        out["reasoning_effort"] = effort
    return out


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
    parallel = body.bool_("parallel_tool_calls")
    plan = plan_tools(body.list_("tools"), body.get("tool_choice"), limits, parallel is not False)
    fmt = _response_format(body)
    messages = chat_messages(body.get("messages"), limits)
    top = _chat_logprobs(body)
    sp = sampling.sampling_params(body, sampling.max_tokens(body, None), limits)
    sp.logprobs, sp.top_logprobs = top is not None, top or 0
    _json_options(body, sp, fmt is not None)
    if (budget := budget_of(body.get(BUDGET))) is not None:
        sp.thinking_budget_tokens = budget
    req, schema = chat_request(messages, sp, sampling.priority(body, priority_header), plan, fmt)
    req.chat_template_kwargs = template_kwargs(chat_variables(body))
    s = sampling.streaming(body)
    return Parsed(req, Output(True, model, s.stream, s.include_usage, top, schema, plan))


def _completion_sampling(body: Body, score: bool, limits: InputLimits) -> pb.SamplingParams:
    """The sampling parameters; scoring (echo with logprobs) may ask for ``max_tokens: 0``: the prompt's
    logprobs alone, nothing generated."""
    if score and body.get("max_tokens") == 0:
        rest = Body({k: v for k, v in body.raw.items() if k != "max_tokens"}, COMPLETION)
        sp = sampling.sampling_params(rest, 0, limits)
    else:
        sp = sampling.sampling_params(body, sampling.max_tokens(body, COMPLETIONS_DEFAULT_MAX_TOKENS), limits)
    sp.echo_prompt_logprobs = score
    return sp


def parse_completion(
    raw: JsonObject, model: str, priority_header: str | None, limits: InputLimits = DEFAULTS
) -> Parsed:
    """A (legacy) Completions body; raises ApiError 400 naming the first bad parameter."""
    body = Body(raw, COMPLETION)
    body.str_("model", required=True)
    prompts = prompts_of(body.get("prompt"))
    if body.str_("suffix"):
        raise bad_param("suffix", "suffix (insertion) is not supported by this server")
    top = body.int_("logprobs", 0, 20)
    echo = bool(body.bool_("echo"))
    sp = _completion_sampling(body, echo and top is not None, limits)
    n = max(sp.n, 1)
    if sp.echo_prompt_logprobs and n > 1:
        raise bad_param("n", "echo with logprobs scores each prompt once: n must be 1")
    check_choices(len(prompts), n)
    best_of = body.int_("best_of", 1, 1 << 30)
    if best_of is not None and best_of != n:
        raise bad_param("best_of", "best_of must equal n: this server returns every choice it generates")
    sp.logprobs, sp.top_logprobs = top is not None, top or 0
    _json_options(body, sp, json_output=False)
    req = pb.GenerateRequest(sampling=sp, priority=sampling.priority(body, priority_header))
    if isinstance(prompts[0], str):
        req.prompt = prompts[0]  # NOTE: the one prompt of the usual request (and of a batch line)
    s = sampling.streaming(body)
    echoes = tuple(p if isinstance(p, str) else "" for p in prompts) if echo else ()
    output = Output(False, model, s.stream, s.include_usage, top, echo=echoes, n=n, score=sp.echo_prompt_logprobs)
    return Parsed(req, output, prompts)
