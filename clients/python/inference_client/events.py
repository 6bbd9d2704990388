"""Typed events of a generation, decoupled from the protobuf classes.

A request produces zero or more :class:`Delta` events followed by exactly one
terminal event: :class:`Done` on success (including cancellation), or — on a
multiplexed stream only — :class:`ErrorEvent`. Single-request iterators raise
:class:`~inference_client.errors.InferenceError` instead of yielding an
``ErrorEvent``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.v1 import inference_pb2 as pb

from .errors import InferenceError, hint_from_message, status_code

_FINISH: dict[int, str] = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CANCELLED: "cancelled",
}


@dataclass(frozen=True)
class Delta:
    """Newly generated text (whole UTF-8 characters) and its token ids."""

    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Usage:
    """Token counts of a request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class Timing:
    """Milliseconds since the server received the request."""

    queue_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(frozen=True)
class Done:
    """Last event of a request: ``finish_reason`` is "stop", "length" or "cancelled"."""

    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    timing: Timing = field(default_factory=Timing)
    preemptions: int = 0


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
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    done: Done | None = None
    error: InferenceError | None = None

    def add(self, event: StreamEvent) -> None:
        """Fold one event into the result."""
        if isinstance(event, Delta):
            self.text += event.text
            self.token_ids.extend(event.token_ids)
        elif isinstance(event, Done):
            self.done = event
        else:
            self.error = event.error

    @property
    def ok(self) -> bool:
        """True when the request ended with a Done event."""
        return self.done is not None


def usage_from_proto(msg: pb.Usage) -> Usage:
    """Convert a ``Usage`` message."""
    return Usage(msg.prompt_tokens, msg.completion_tokens, msg.cached_tokens)


def timing_from_proto(msg: pb.Timing) -> Timing:
    """Convert a ``Timing`` message."""
    return Timing(msg.queue_ms, msg.ttft_ms, msg.total_ms)


def finish_reason_name(value: int) -> str:
    """Name of a FinishReason: "stop", "length", "cancelled" or "unspecified"."""
    return _FINISH.get(value, "unspecified")


def event_from_proto(resp: pb.GenerateResponse) -> StreamEvent | None:
    """The typed event of a ``GenerateResponse``; None if it carries no event."""
    kind = resp.WhichOneof("event")
    if kind == "delta":
        return Delta(resp.delta.text, tuple(resp.delta.token_ids))
    if kind == "done":
        d = resp.done
        return Done(
            finish_reason_name(d.finish_reason),
            usage_from_proto(d.usage),
            timing_from_proto(d.timing),
            d.preemptions,
        )
    if kind == "error":
        e = resp.error
        hint_ms = getattr(e, "retry_after_ms", 0)  # absent from stubs older than the field
        error = InferenceError(
            status_code(e.code),
            e.message,
            retry_after=hint_ms / 1000.0 if hint_ms else hint_from_message(e.message),
            request_id=resp.request_id,
        )
        return ErrorEvent(error)
    return None
