"""A request's events -> the OpenAI answer: one JSON object, or server-sent event chunks.

Final checks happen when a choice ends with finish_reason ``stop``:

* with a JSON Schema (``response_format``, or a named / required tool call) the
  document is validated again (``GrammarService.validate``, as GenerateJSON
  does); a document cut off by ``max_tokens`` keeps finish_reason ``length``
  and is never validated or presented as a call;
* tool output becomes ``tool_calls`` (``service.http.tools.tool_calls``) with
  finish_reason ``tool_calls``.

A streamed tool call is buffered and sent as one chunk once it is complete
(with ``tool_choice: "auto"`` only while the output could still be a call:
text that does not start with ``<`` streams as it comes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from inference.v1 import inference_pb2 as pb

from service.http.errors import ApiError, from_status
from service.http.render import Choice, Choices, Json
from service.http.run import Run
from service.http.runs import Runs
from service.http.tools import tool_calls
from service.request.errors import BadRequest


class Validator(Protocol):
    """The intake's grammar service, as far as final validation needs it."""

    async def compiled(self, kind: str, source: str, record: bool = True) -> Any: ...
    def validate(self, compiled: Any, text: str) -> None: ...


def event_error(e: pb.Error) -> ApiError:
    return from_status(e.status, e.message, e.retry_after_ms, e.quota, e.reason)


def cancelled() -> ApiError:
    """A request the server cancelled (its client is usually gone; a stalled stream, a drain's end)."""
    return ApiError(503, "request cancelled", type="service_unavailable_error", retry_after_ms=1000)


@dataclass
class Answer:
    """Folds one request's events into ``Choices``; see the module docstring."""

    choices: Choices
    grammar: Validator
    state: dict[int, dict[str, Any]] = field(default_factory=dict)

    async def finish(self, d: pb.Done) -> Choice:
        """Record a choice's Done and run its final checks; raises ApiError."""
        if d.finish_reason == pb.FINISH_REASON_CANCELLED:
            raise cancelled()
        c = self.choices.add_done(d)
        out = self.choices.output
        if c.finish != "stop":
            return c
        if out.schema is not None:
            try:
                compiled = await self.grammar.compiled("json_schema", out.schema, record=False)
                self.grammar.validate(compiled, c.text)
            except BadRequest as exc:
                raise ApiError(500, str(exc), type="server_error") from None
        if out.tools is not None and (calls := tool_calls(out.tools, c.text)) is not None:
            c.tool_calls, c.finish = calls, "tool_calls"
        return c

    async def complete(self, run: Run | Runs) -> Json | None:
        """The whole answer (None: the client left first); raises ApiError for a failed request."""
        async for ev in run.events():
            kind = ev.WhichOneof("event")
            if kind == "delta":
                self.choices.add_delta(ev.delta)
            elif kind == "done":
                await self.finish(ev.done)
            else:
                raise event_error(ev.error)
        if run.aborted and not self.choices.choices:
            return None
        return self.choices.response()

    # -- streaming ------------------------------------------------------------------------------
    def _st(self, index: int) -> dict[str, Any]:
        tools = self.choices.output.tools
        return self.state.setdefault(index, {"opened": False, "echoed": False, "buffer": tools is not None, "sent": 0})

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

    def on_delta(self, d: pb.Delta) -> list[Json]:
        """Chunks for one delta (only the role chunk while a tool call is being buffered)."""
        c = self.choices.add_delta(d)
        out = self._open(d.choice_index)
        st = self._st(d.choice_index)
        tools = self.choices.output.tools
        if st["buffer"]:
            if tools is not None and tools.mode == "auto" and c.text and not c.text.startswith("<"):
                st["buffer"] = False  # plain text: it can no longer be a call
                out += self._text_chunk(d.choice_index, c.text, list(c.logprobs))
            return out
        return out + self._text_chunk(d.choice_index, d.text, list(d.logprobs))

    async def on_done(self, d: pb.Done) -> list[Json]:
        """The closing chunks of one choice; raises ApiError (sent as an error event)."""
        c = await self.finish(d)
        i = d.choice_index
        out = self._open(i)
        if c.tool_calls:
            out.append(self.choices.chunk(i, tool_calls=c.tool_calls))
        elif self._st(i)["buffer"]:  # a call cut off by max_tokens: its text, never a call
            out += self._text_chunk(i, c.text, list(c.logprobs))
        else:
            out += self._text_chunk(i, "", [])  # completions: the echo of a choice that generated nothing
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
