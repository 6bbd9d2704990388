"""Request specifications and their conversion to protobuf messages.

The client validates nothing the server validates (empty prompt, ranges, both
prompt and messages...): such mistakes come back as INVALID_ARGUMENT, so the
server stays the single source of truth. Only client-side shape errors (an
unknown priority name, two output constraints) raise ``ValueError`` here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from inference.v1 import inference_pb2 as pb

from .tools import ToolChoiceLike, ToolLike, call_proto, tool_choice_fields, tool_protos

MessageLike = Mapping[str, Any] | tuple[str, str] | pb.ChatMessage
"""A chat turn: ``{"role": ..., "content": ...}`` (an assistant's may have ``tool_calls``, a tool result
``tool_call_id`` and ``name``), ``(role, content)`` or a ChatMessage."""

_PRIORITIES: dict[str, pb.Priority] = {
    "interactive": pb.PRIORITY_INTERACTIVE,
    "batch": pb.PRIORITY_BATCH,
    "unspecified": pb.PRIORITY_UNSPECIFIED,
}


def priority_value(priority: str | int | None) -> pb.Priority:
    """Map "interactive"/"batch" (or an enum number) to the Priority enum."""
    if priority is None:
        return pb.PRIORITY_UNSPECIFIED
    if isinstance(priority, int):
        return cast(pb.Priority, priority)
    try:
        return _PRIORITIES[priority.lower()]
    except KeyError:
        raise ValueError(f"unknown priority {priority!r}; use 'interactive' or 'batch'") from None


_OPTIONAL_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "top_logprobs",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "json_repeat_penalty",
    "thinking_budget_tokens",
)
_JSON_FINISH: dict[str, pb.JsonFinish] = {
    "cut_off": pb.JSON_FINISH_CUT_OFF,
    "close_within_budget": pb.JSON_FINISH_CLOSE_WITHIN_BUDGET,
    "unspecified": pb.JSON_FINISH_UNSPECIFIED,
}


def json_finish_value(value: str | int | None) -> pb.JsonFinish:
    """Map "cut_off"/"close_within_budget" (or an enum number) to the JsonFinish enum."""
    if value is None:
        return pb.JSON_FINISH_UNSPECIFIED
    if isinstance(value, int):
        return cast(pb.JsonFinish, value)
    try:
        return _JSON_FINISH[value.lower()]
    except KeyError:
        raise ValueError(f"unknown json_finish {value!r}; use 'cut_off' or 'close_within_budget'") from None


def chat_messages(messages: Sequence[MessageLike] | None) -> list[pb.ChatMessage]:
    """Convert chat turns to ChatMessage protos."""
    out: list[pb.ChatMessage] = []
    for m in messages or ():
        if isinstance(m, pb.ChatMessage):
            out.append(m)
        elif isinstance(m, tuple):
            out.append(pb.ChatMessage(role=m[0], content=m[1]))
        else:
            out.append(pb.ChatMessage(
                role=m["role"], content=m.get("content") or "", tool_calls=[call_proto(c) for c in m.get("tool_calls") or ()],
                tool_call_id=m.get("tool_call_id") or "", name=m.get("name") or "",
            ))
    return out


def schema_text(schema: Mapping[str, Any] | str) -> str:
    """A JSON Schema as JSON text (dicts are serialized, strings passed through)."""
    return schema if isinstance(schema, str) else json.dumps(schema)


class SamplingOptions(TypedDict, total=False):
    """Keyword options shared by ``generate``, ``generate_many`` and ``generate_json``.

    Omitted options take the server defaults (see ``RequestSpec``).
    """

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int
    stop: Sequence[str]
    ignore_eos: bool
    priority: str | int
    logprobs: bool
    top_logprobs: int
    n: int
    echo_prompt_logprobs: bool
    frequency_penalty: float
    presence_penalty: float
    repetition_penalty: float
    logit_bias: Mapping[int, float]
    json_finish: str | int
    json_repeat_penalty: float
    thinking_budget_tokens: int
    raw_prompt: bool
    pretty: bool


class GenerateOptions(SamplingOptions, total=False):
    """``SamplingOptions`` plus at most one output constraint (Generate only)."""

    json_schema: Mapping[str, Any] | str
    regex: str
    lark_grammar: str
    gbnf_grammar: str
    tools: Sequence[ToolLike]
    tool_choice: ToolChoiceLike
    parallel_tool_calls: bool


@dataclass(frozen=True)
class RequestSpec:
    """One generation request: input, decoding parameters, tier and constraint.

    Exactly one of ``prompt`` and ``messages`` should be set. ``None`` sampling
    fields take the server defaults. At most one of ``json_schema``, ``regex``,
    ``lark_grammar`` and ``gbnf_grammar`` may be set. ``request_id`` None means
    the client picks a unique id.
    """

    prompt: str | None = None
    messages: Sequence[MessageLike] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    priority: str | int | None = None
    json_schema: Mapping[str, Any] | str | None = None
    regex: str | None = None
    lark_grammar: str | None = None
    gbnf_grammar: str | None = None
    request_id: str | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    n: int | None = None
    echo_prompt_logprobs: bool = False
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: Mapping[int, float] | None = None
    json_finish: str | int | None = None  # "cut_off" or "close_within_budget" (JSON output only)
    json_repeat_penalty: float | None = None
    thinking_budget_tokens: int | None = None  # a reasoning model's chat: the thought's tokens at most (0: off)
    raw_prompt: bool = False  # GenerateJSON only: send a bare prompt without the chat template
    pretty: bool = False  # GenerateJSON only: the document indented
    tools: Sequence[ToolLike] = ()  # functions the model may call (see ``inference_client.tools``)
    tool_choice: ToolChoiceLike | None = None  # "auto" (None), "required", "none" or a function's name
    parallel_tool_calls: bool | None = None  # None: the server's default (true)

    def sampling(self) -> pb.SamplingParams:
        """The SamplingParams message; unset fields stay unset (server defaults)."""
        params = pb.SamplingParams(
            stop=list(self.stop),
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            echo_prompt_logprobs=self.echo_prompt_logprobs,
            logit_bias=dict(self.logit_bias or {}),
            json_finish=json_finish_value(self.json_finish),
        )
        for name in _OPTIONAL_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(params, name, value)
        return params

    def response_format(self) -> pb.ResponseFormat | None:
        """The ResponseFormat message, or None when the output is unconstrained."""
        given = {
            "json_schema": None if self.json_schema is None else schema_text(self.json_schema),
            "regex": self.regex,
            "lark_grammar": self.lark_grammar,
            "gbnf_grammar": self.gbnf_grammar,
        }
        chosen = {k: v for k, v in given.items() if v is not None}
        if len(chosen) > 1:
            raise ValueError(f"at most one output constraint, got {sorted(chosen)}")
        return pb.ResponseFormat(**chosen) if chosen else None

    def to_proto(self, request_id: str) -> pb.GenerateRequest:
        """The GenerateRequest for this spec under ``request_id``."""
        if self.raw_prompt or self.pretty:
            raise ValueError("raw_prompt and pretty are GenerateJSON options (Generate sends prompts as they are)")
        msg = pb.GenerateRequest(
            request_id=request_id,
            prompt=self.prompt or "",
            messages=chat_messages(self.messages),
            sampling=self.sampling(),
            priority=priority_value(self.priority),
            tools=tool_protos(self.tools),
            **tool_choice_fields(self.tool_choice),
        )
        if self.parallel_tool_calls is not None:
            msg.parallel_tool_calls = self.parallel_tool_calls
        fmt = self.response_format()
        if fmt is not None:
            msg.response_format.CopyFrom(fmt)
        return msg


def json_request(schema: Mapping[str, Any] | str, spec: RequestSpec) -> pb.GenerateJSONRequest:
    """The GenerateJSONRequest for ``schema`` with the input and sampling of ``spec``."""
    return pb.GenerateJSONRequest(
        prompt=spec.prompt or "",
        messages=chat_messages(spec.messages),
        json_schema=schema_text(schema),
        sampling=spec.sampling(),
        priority=priority_value(spec.priority),
        raw_prompt=spec.raw_prompt,
        pretty=spec.pretty,
    )


def cancel_request(request_id: str) -> pb.GenerateRequest:
    """The GenerateRequest that cancels the in-flight ``request_id``."""
    return pb.GenerateRequest(request_id=request_id, cancel=True)
