"""A request's events -> the OpenAI answer: one JSON object, or server-sent event chunks.

A reasoning model's chat (``Output.thought``) is first split into thought and
answer (``service.chat.thought.ThoughtReader``): the thought is the message's
``reasoning_content`` (``delta.reasoning_content`` streamed, before the answer's
chunks), everything below reads the answer alone.

Final checks happen when a choice ends with finish_reason ``stop``:

* with a JSON Schema (``response_format``, or a named / required tool call) the
  document is validated again (``GrammarService.validate``, as GenerateJSON
  does); a document that breaks a keyword the grammar could not enforce is a
  400 with code ``schema_not_enforced`` (``not_enforced``; streamed: the
  dialect's error event); a document cut off by ``max_tokens`` keeps
  finish_reason ``length`` and is never validated or presented as a call;
* with tools, the output is read in the model's call syntax as it comes
  (``service.http.tools.CallReader``): the text before the calls is the
  message's content, the calls are ``tool_calls`` (each validated against its
  function's schema) with finish_reason ``tool_calls``. A choice cut off by
  ``max_tokens`` keeps finish_reason ``length`` and its content, never a call.

Streamed, content goes out as it is read and each call as OpenAI streams one: a
first delta with its ``index``, ``id``, ``type`` and ``function.name``, then
``function.arguments`` in pieces whose concatenation is the final arguments (a
call cut off by ``max_tokens`` ends unfinished, with finish_reason ``length``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from inference.v1 import inference_pb2 as pb

from service.chat.thought import ThoughtReader
from service.http.errors import ApiError, from_status
from service.http.render import Choice, Choices, Json
from service.http.run import Run
from service.http.runs import Runs
from service.http.tools import CallReader
from service.request.errors import BadRequest
from service.request.events import SCHEMA_NOT_ENFORCED


class Validator(Protocol):
    """The intake's grammar service, as far as final validation needs it."""

    async def compiled(self, kind: str, source: str, record: bool = True) -> Any: ...
    def validate(self, compiled: Any, text: str) -> None: ...


def event_error(e: pb.Error) -> ApiError:
    return from_status(e.status, e.message, e.retry_after_ms, e.quota, e.reason)


def not_enforced(exc: BadRequest, param: str) -> ApiError:
    """The failed final check of a document (``GrammarService.validate``): a 400 with code
    ``schema_not_enforced`` naming the format's parameter (any other failure: its own status)."""
    if exc.reason != SCHEMA_NOT_ENFORCED:
        return from_status(exc.status, str(exc))
    return ApiError(400, str(exc), param=param, code=SCHEMA_NOT_ENFORCED)


def cancelled() -> ApiError:
    """A request the server cancelled (its client is usually gone; a stalled stream, a drain's end)."""
    return ApiError(503, "request cancelled", type="service_unavailable_error", retry_after_ms=1000)


@dataclass
class Answer:
    """Folds one request's events into ``Choices``; see the module docstring."""

    choices: Choices
    grammar: Validator
    state: dict[int, dict[str, Any]] = field(default_factory=dict)
    readers: dict[int, CallReader] = field(default_factory=dict)
    thoughts: dict[int, ThoughtReader] = field(default_factory=dict)

    def _thought(self, d: pb.Delta | pb.Done, text: str, final: bool = False) -> tuple[str, str]:
        """(thought, answer) of a choice's next text (a reasoning model's chat), its tokens counted as
        reasoning while the output is in the thought; (``""``, text) for other requests."""
        plan = self.choices.output.thought
        if plan is None:
            return "", text
        reader = self.thoughts.setdefault(d.choice_index, plan.reader())
        thinking = reader.thinking_now
        thought, answer = reader.close() if final else reader.feed(text)
        c = self.choices.get(d.choice_index)
        c.reasoning = reader.thought
        if isinstance(d, pb.Delta) and (thinking or thought):
            self.choices.reasoning_tokens += plan.thought_tokens(list(d.token_ids), reader.thinking_now)
        return thought, answer

    def _reader(self, index: int) -> CallReader | None:
        """Choice ``index``'s reader of calls (None: no tools)."""
        plan = self.choices.output.tools
        if plan is None:
            return None
        if index not in self.readers:
            self.readers[index] = CallReader.of(plan)
        return self.readers[index]

    def _read(self, d: pb.Delta) -> tuple[Choice, str, str, list[Json]]:
        """A delta recorded: (its choice, its new thought, its new content, its tool-call deltas)."""
        c = self.choices.add_delta(d)
        thought, text = self._thought(d, d.text)
        reader = self._reader(d.choice_index)
        return (c, thought, text, []) if reader is None else (c, thought, *reader.feed(text))

    async def finish(self, d: pb.Done) -> tuple[Choice, str, str, list[Json]]:
        """Record a choice's Done and run its final checks: (the choice, its last thought, its last content, its
        last tool-call deltas); raises ApiError."""
        if d.finish_reason == pb.FINISH_REASON_CANCELLED:
            raise cancelled()
        c = self.choices.add_done(d)
        out = self.choices.output
        thought, held = self._thought(d, "", final=True)
        if out.thought is not None:  # NOTE: the answer alone (the choice's text held the thought's markers too)
            c.text = self.thoughts[d.choice_index].answer
        reader = self._reader(d.choice_index)
        text, deltas = held, list[Json]()
        if reader is not None:
            more, deltas = reader.feed(held)
            last, closing = reader.close(c.finish == "stop")
            text, deltas = more + last, deltas + closing
            c.text = reader.content
            if c.finish == "stop" and reader.calls:
                c.tool_calls, c.finish = reader.calls, "tool_calls"
        if c.finish == "stop" and out.schema is not None:
            try:
                compiled = await self.grammar.compiled("json_schema", out.schema, record=False)
                self.grammar.validate(compiled, c.text)
            except BadRequest as exc:
                raise not_enforced(exc, out.schema_param) from None
        return c, thought, text, deltas

    async def complete(self, run: Run | Runs) -> Json | None:
        """The whole answer (None: the client left first); raises ApiError for a failed request."""
        async for ev in run.events():
            kind = ev.WhichOneof("event")
            if kind == "delta":
                self._read(ev.delta)
            elif kind == "done":
                await self.finish(ev.done)
            else:
                raise event_error(ev.error)
        if run.aborted and not self.choices.choices:
            return None
        return self.choices.response()

    # -- streaming ------------------------------------------------------------------------------
    def _st(self, index: int) -> dict[str, Any]:
        return self.state.setdefault(index, {"opened": False, "echoed": False, "sent": 0})

    def _open(self, index: int) -> list[Json]:
        """Chat: the role-only chunk, once per choice, before anything else of it (as OpenAI sends it)."""
        st = self._st(index)
        if st["opened"]:
            return []
        st["opened"] = True
        return [self.choices.role_chunk(index)] if self.choices.output.chat else []

    def _text_chunk(self, index: int, text: str, entries: list[pb.TokenLogprob]) -> list[Json]:
        """The chunk of new text (completions: the echoed prompt before the first); none when it would be
        empty: a delta that completed no character and carries no logprobs is not sent."""
        st = self._st(index)
        echo = self.choices.echo(index)
        prefix = "" if st["echoed"] else echo
        st["echoed"] = True
        if not prefix and not text and not entries:
            return []
        offset = len(echo) + st["sent"]  # where ``text`` starts in the choice's whole text
        st["sent"] += len(text)
        return [self.choices.chunk(index, text=prefix + text, entries=entries, offset=offset, echoed=bool(prefix))]

    def _thought_chunk(self, index: int, thought: str) -> list[Json]:
        """The chunk of new thought text (``delta.reasoning_content``), none when there is none."""
        return [self.choices.chunk(index, reasoning=thought)] if thought else []

    def on_delta(self, d: pb.Delta) -> list[Json]:
        """Chunks for one delta: its thought, its content, then its tool-call deltas."""
        _c, thought, text, deltas = self._read(d)
        out = self._open(d.choice_index) + self._thought_chunk(d.choice_index, thought)
        out += self._text_chunk(d.choice_index, text, list(d.logprobs))
        if deltas:
            out.append(self.choices.chunk(d.choice_index, tool_deltas=deltas))
        return out

    async def on_done(self, d: pb.Done) -> list[Json]:
        """The closing chunks of one choice; raises ApiError (sent as an error event)."""
        c, thought, text, deltas = await self.finish(d)
        i = d.choice_index
        out = self._open(i) + self._thought_chunk(i, thought)
        out += self._text_chunk(i, text, [])  # completions: also the echo of a choice that generated nothing
        if deltas:
            out.append(self.choices.chunk(i, tool_deltas=deltas))
        out.append(self.choices.chunk(i, finish=c.finish, closed=c.closed))
        return out

    async def stream(self, first: pb.GenerateResponse, run: Run | Runs) -> AsyncIterator[Json]:
        """Chunks from the first event on; the last is the usage chunk when asked for."""

        async def events() -> AsyncIterator[pb.GenerateResponse]:
            yield first
            async for ev in run.events():
                yield ev

        async for ev in events():
            kind = ev.WhichOneof("event")
            if kind == "delta":
                for chunk in self.on_delta(ev.delta):
                    yield chunk
            elif kind == "done":
                for chunk in await self.on_done(ev.done):
                    yield chunk
            else:
                raise event_error(ev.error)
        if self.choices.output.include_usage and not run.aborted:
            yield self.choices.usage_chunk()
