"""Typed events of a generation, decoupled from the protobuf classes.

A request produces zero or more :class:`Delta` events followed by exactly one
terminal event: :class:`Done` on success (including cancellation), or — on a
multiplexed stream only — :class:`ErrorEvent`. Single-request iterators raise
:class:`~inference_client.errors.InferenceError` instead of yielding an
``ErrorEvent``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from inference.v1 import inference_pb2 as pb

from .errors import InferenceError, hint_from_message, status_code
from .tools import ToolCall, calls_from_proto

_FINISH: dict[int, str] = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CANCELLED: "cancelled",
    pb.FINISH_REASON_CLOSED: "closed",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


@dataclass(frozen=True)
class TokenLogprob:
    """A token's natural-log probability and, when asked, the most likely alternatives there."""

    token_id: int
    token: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()  # (token_id, token, logprob), most likely first


@dataclass(frozen=True)
class Delta:
    """Newly generated text (whole UTF-8 characters) and its token ids.

    With ``logprobs`` requested, ``logprobs`` has one entry per token id; with
    ``echo_prompt_logprobs``, one delta (before any text) carries ``prompt_logprobs``.
    ``choice_index`` says which of the ``n`` choices the delta belongs to. With tools, ``text`` is
    only the answer's text and ``tool_calls`` the calls completed with this delta (each whole, sent once).
    A reasoning model's chat (``GetModelInfo().chat.reasoning`` set): ``reasoning`` is its thought
    (markers removed) and ``text`` its answer alone.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    choice_index: int = 0
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""


@dataclass(frozen=True)
class Usage:
    """Token counts of a request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, the thought's


@dataclass(frozen=True)
class Timing:
    """Milliseconds since the server received the request."""

    queue_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(frozen=True)
class Done:
    """Last event of a request: ``finish_reason`` is "stop", "length", "cancelled", "closed"
    (a JSON document closed early to fit max_tokens: json_finish) or "tool_calls" (the answer ended with
    calls: ``tool_calls`` lists every call of the choice)."""

    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    timing: Timing = field(default_factory=Timing)
    preemptions: int = 0
    choice_index: int = 0  # a request with n choices ends with n Done events
    cache_hit: bool = False  # replayed from the server's response cache
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class ErrorEvent:
    """Per-request failure on a multiplexed stream; the other requests go on."""

    error: InferenceError


Event = Delta | Done
StreamEvent = Delta | Done | ErrorEvent


@dataclass
class Result:
    """Everything one request produced, as collected from its events.

    Exactly one of ``done`` and ``error`` is set once the request finished.
    """

    request_id: str
    text: str = ""  # choice 0's text (a reasoning model's chat: its answer)
    reasoning: str = ""  # choice 0's thought (a reasoning model's chat)
    token_ids: list[int] = field(default_factory=list)
    done: Done | None = None  # the last Done (of the last choice to end)
    error: InferenceError | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # choice 0's
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    choices: dict[int, str] = field(default_factory=dict)  # text of every choice
    dones: dict[int, Done] = field(default_factory=dict)  # Done of every choice
    tool_calls: list[ToolCall] = field(default_factory=list)  # choice 0's calls, as they came

    def add(self, event: StreamEvent) -> None:
        """Fold one event into the result."""
        if isinstance(event, Delta):
            i = event.choice_index
            self.choices[i] = self.choices.get(i, "") + event.text
            self.prompt_logprobs.extend(event.prompt_logprobs)
            if i == 0:
                self.text += event.text
                self.reasoning += event.reasoning
                self.token_ids.extend(event.token_ids)
                self.logprobs.extend(event.logprobs)
                self.tool_calls.extend(event.tool_calls)
        elif isinstance(event, Done):
            self.done = event
            self.dones[event.choice_index] = event
        else:
            self.error = event.error

    @property
    def ok(self) -> bool:
        """True when the request ended with a Done event."""
        return self.done is not None


def usage_from_proto(msg: pb.Usage) -> Usage:
    """Convert a ``Usage`` message."""
    return Usage(msg.prompt_tokens, msg.completion_tokens, msg.cached_tokens,
                 getattr(msg, "reasoning_tokens", 0))  # absent from stubs older than the field


def timing_from_proto(msg: pb.Timing) -> Timing:
    """Convert a ``Timing`` message."""
    return Timing(msg.queue_ms, msg.ttft_ms, msg.total_ms)


def finish_reason_name(value: int) -> str:
    """Name of a FinishReason: "stop", "length", "cancelled" or "unspecified"."""
    return _FINISH.get(value, "unspecified")


def _logprobs(entries: Iterable[pb.TokenLogprob]) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(e.token_id, e.token, e.logprob, tuple((t.token_id, t.token, t.logprob) for t in e.top_logprobs))
        for e in entries
    )


def event_from_proto(resp: pb.GenerateResponse) -> StreamEvent | None:
    """The typed event of a ``GenerateResponse``; None if it carries no event."""
    kind = resp.WhichOneof("event")
    if kind == "delta":
        d = resp.delta
        return Delta(
            d.text, tuple(d.token_ids), _logprobs(d.logprobs), d.choice_index, _logprobs(d.prompt_logprobs),
            calls_from_proto(d.tool_calls),
            getattr(d, "reasoning", ""),  # absent from stubs older than the field
        )
    if kind == "done":
        d = resp.done
        return Done(
            finish_reason_name(d.finish_reason),
            usage_from_proto(d.usage),
            timing_from_proto(d.timing),
            d.preemptions,
            d.choice_index,
            d.cache_hit,
            calls_from_proto(d.tool_calls),
        )
    if kind == "error":
        e = resp.error
        hint_ms = getattr(e, "retry_after_ms", 0)  # absent from stubs older than the field
        error = InferenceError(
            status_code(e.code),
            e.message,
            retry_after=hint_ms / 1000.0 if hint_ms else hint_from_message(e.message),
            request_id=resp.request_id,
            reason=getattr(e, "reason", ""),  # absent from stubs older than the field
        )
        return ErrorEvent(error)
    return None
