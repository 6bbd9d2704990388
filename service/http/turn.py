"""One assistant turn as dialect-neutral pieces (thought, text, a tool call, the end) and the drivers that write it.

The Anthropic Messages and OpenAI Responses dialects answer from the same
decisions as Chat Completions: ``Answer`` (``service.http.answer``) folds the
run's events (a reasoning model's thought apart from its answer; text released
as it comes, or held while it may still become a tool call; the final
validation of a JSON document or call; the finish reason and usage). ``Turn``
reads its chat chunks back as ``Thought``, ``Text``, ``Call`` and ``End``
pieces, so a dialect only renders pieces, through a ``Writer``:

* ``stream``: the writer's opening events, one batch of events per piece, and
  exactly one terminal event: the writer's end (at ``End``) or its failure
  event (an error event of the run, a failed final validation, a bug, or a run
  that ended without an end because the client left);
* ``whole``: the same pieces folded into the writer's final object (None: the
  client left first); a failure raises ApiError (the route's error response).

So a streamed and an unstreamed answer can only differ in framing. One choice
(neither dialect has ``n``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from inference.v1 import inference_pb2 as pb

from service.http.answer import Answer, cancelled, event_error
from service.http.errors import ApiError
from service.http.render import Json
from service.http.run import Run
from service.http.runs import Runs

log = logging.getLogger("service.http")


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Thought:
    text: str  # a reasoning model's thought (markers removed), before the answer's pieces


@dataclass(frozen=True)
class Call:
    call_id: str  # "call_<hex>"
    name: str
    arguments: str  # a JSON object, validated against the function's parameters


@dataclass(frozen=True)
class Usage:
    prompt: int  # tokens of the rendered prompt
    completion: int
    cached: int  # prompt tokens served from the prefix cache
    reasoning: int = 0  # of completion, the thought's tokens


@dataclass(frozen=True)
class End:
    finish: str  # "stop", "length" (max tokens) or "tool_calls"
    usage: Usage
    stop_sequence: str | None = None  # the stop string that ended the turn (finish "stop" only)


Piece = Thought | Text | Call | End


class Writer(Protocol):
    """A dialect's rendering of one turn: events per piece, and the whole object at the end."""

    def start(self) -> list[Json]: ...
    def on(self, piece: Piece) -> list[Json]: ...
    def failed(self, exc: ApiError) -> list[Json]: ...
    def final(self) -> Json: ...


def matched_stop(token_bytes: Sequence[bytes], token_ids: list[int], text: str, stops: Sequence[str]) -> str | None:
    """The stop string that ended a turn whose released text is ``text``, or None (end of generation).

    NOTE: the engine releases the text before a stop string and drops the
    string, but the turn's token ids still hold the tokens that spelled it:
    decoded, they continue ``text`` with that stop string. An end-of-generation
    token is never among the ids, so after one nothing follows ``text``.
    """
    if not stops:
        return None
    full = b"".join(token_bytes[t] for t in token_ids).decode("utf-8", errors="replace")
    if not full.startswith(text):  # NOTE: a reasoning model's answer follows its thought in the tokens
        return next((s for s in stops if text and text + s in full), None)
    tail = full[len(text):]
    return next((s for s in stops if tail.startswith(s)), None)


class Turn:
    """The pieces of one run's events (see the module docstring); ``stops`` with ``token_bytes``: which
    stop string ended it (``End.stop_sequence``)."""

    def __init__(self, answer: Answer, stops: Sequence[str] = (), token_bytes: Sequence[bytes] | None = None) -> None:
        self.answer, self.stops, self.token_bytes = answer, stops, token_bytes
        self.token_ids: list[int] = []  # every generated token, stop strings included
        self.calls: dict[int, dict[str, str]] = {}  # the calls' deltas gathered, by index

    async def pieces(self, events: AsyncIterator[pb.GenerateResponse]) -> AsyncIterator[Piece]:
        """Text and calls as released, then ``End``; raises ApiError for a failed request."""
        async for ev in events:
            kind = ev.WhichOneof("event")
            if kind == "delta":
                self.token_ids.extend(ev.delta.token_ids)
                chunks = self.answer.on_delta(ev.delta)
            elif kind == "done":
                chunks = await self.answer.on_done(ev.done)
            else:
                raise event_error(ev.error)
            for chunk in chunks:
                for piece in self._split(chunk):
                    yield piece

    def _split(self, chunk: Json) -> list[Piece]:
        """The pieces of one chat chunk: its thought, its text; its calls' deltas are gathered, and each call is one
        ``Call`` (whole, validated) when the turn ends with them."""
        row = chunk["choices"][0]
        delta = row.get("delta") or {}
        out: list[Piece] = [Thought(delta["reasoning_content"])] if delta.get("reasoning_content") else []
        out += [Text(delta["content"])] if delta.get("content") else []
        for d in delta.get("tool_calls") or []:
            call = self.calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
            call["id"] = d.get("id", call["id"])
            fn = d.get("function") or {}
            call["name"] = fn.get("name", call["name"])
            call["arguments"] += fn.get("arguments", "")
        if (finish := row.get("finish_reason")) is not None:
            if finish == "tool_calls":
                out += [Call(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items())]
            out.append(self._end(finish))
        return out

    def _end(self, finish: str) -> End:
        c = self.answer.choices
        usage = Usage(c.prompt_tokens, c.completion_tokens, c.cached_tokens, c.reasoning_tokens)
        stop = None
        if finish == "stop" and self.token_bytes is not None:
            stop = matched_stop(self.token_bytes, self.token_ids, c.get(0).text, self.stops)
        return End(finish, usage, stop)


async def run_events(first: pb.GenerateResponse | None, run: Run | Runs) -> AsyncIterator[pb.GenerateResponse]:
    """``first`` (the event the status line waited for), then the run's other events."""
    if first is not None:
        yield first
    async for ev in run.events():
        yield ev


async def stream(writer: Writer, turn: Turn, events: AsyncIterator[pb.GenerateResponse]) -> AsyncIterator[Json]:
    """The writer's events for the turn, ending with exactly one terminal event (see the module docstring)."""
    for item in writer.start():
        yield item
    try:
        async for piece in turn.pieces(events):
            for item in writer.on(piece):
                yield item
            if isinstance(piece, End):
                return
        failure = cancelled()  # NOTE: the run ended without an end: the client left (nobody reads this)
    except ApiError as exc:
        failure = exc
    except Exception as exc:  # a bug: the stream still ends with its failure event
        log.exception("streamed answer failed", exc_info=exc)
        failure = ApiError(500, f"internal error: {type(exc).__name__}", type="server_error")
    for item in writer.failed(failure):
        yield item


async def whole(writer: Writer, turn: Turn, events: AsyncIterator[pb.GenerateResponse]) -> Json | None:
    """The writer's final object (None: the run ended first, its client gone); raises ApiError."""
    writer.start()
    async for piece in turn.pieces(events):
        writer.on(piece)
        if isinstance(piece, End):
            return writer.final()
    return None
