"""An OpenAI Responses answer: the ``response`` object, or its event stream; the Responses dialect.

Output items: a reasoning model's thought first, as one ``reasoning`` item (its
text one ``reasoning_text`` content part), one ``message`` (``output_text``
part) for text, one ``function_call`` (``call_id``, ``name``, ``arguments``) for
a tool call. A
streamed answer is the Responses event sequence, every event with its
``sequence_number``::

    response.created, response.in_progress
    response.output_item.added, response.content_part.added,
      response.reasoning_text.delta*, response.reasoning_text.done,
      response.content_part.done, response.output_item.done             a reasoning item
    response.output_item.added, response.content_part.added,
      response.output_text.delta*, response.output_text.done,
      response.content_part.done, response.output_item.done             a message
    response.output_item.added, response.function_call_arguments.delta,
      response.function_call_arguments.done, response.output_item.done  a function call
    response.completed | response.incomplete (max_output_tokens) | response.failed

exactly one of the last three ends every stream: a failure after the status
line (a refusal while queued, a cancelled request, a failed final validation)
is ``response.failed`` with the error's ``code`` and ``message``. Nothing is
stored: ``store`` is always false in the object.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.http.answer import Answer
from service.http.body import parse_json
from service.http.dialect import check_model, typed_event
from service.http.errors import ApiError
from service.http.render import Json
from service.http.requests import Parsed
from service.http.responses import ResponsesParsed, parse_responses
from service.http.run import Run
from service.http.runs import Runs
from service.http.turn import Call, End, Piece, Text, Thought, Turn, run_events, stream, whole


def usage(end: End) -> Json:
    u = end.usage
    return {"input_tokens": u.prompt, "input_tokens_details": {"cached_tokens": u.cached},
            "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": u.reasoning},
            "total_tokens": u.prompt + u.completion}


def _part(text: str, kind: str = "message") -> Json:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _names(kind: str) -> tuple[str, Json]:
    """The event name of an item kind's text, and the fields its delta and done events carry besides."""
    return ("reasoning_text", {}) if kind == "reasoning" else ("output_text", {"logprobs": []})


def _item(kind: str) -> Json:
    """A new output item: a ``message``, or a reasoning model's thought as a ``reasoning`` item (its text as a
    ``reasoning_text`` content part; no summary, no encrypted content)."""
    if kind == "reasoning":
        return {"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "status": "in_progress", "summary": [],
                "content": [], "encrypted_content": None}
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": "in_progress", "role": "assistant",
            "content": []}


class ResponseWriter:
    """One turn as a ``response`` object and its events (``service.http.turn.Writer``)."""

    def __init__(self, response_id: str, model: str, echo: Json) -> None:
        self.id, self.model, self.echo = response_id, model, echo
        self.created = int(time.time())
        self.seq = itertools.count()
        self.output: list[Json] = []
        self.message: Json | None = None  # the open message item
        self.end: End | None = None

    def _event(self, kind: str, **fields: Any) -> Json:
        return {"type": kind, "sequence_number": next(self.seq), **fields}

    def _response(self, status: str, error: Json | None = None) -> Json:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "background": False, "error": error, "incomplete_details": incomplete, "model": self.model,
                "output": list(self.output), "previous_response_id": None, "service_tier": "default",
                "store": False, "top_logprobs": 0, **self.echo,
                "usage": usage(self.end) if self.end is not None else None}

    def start(self) -> list[Json]:
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def _where(self, item: Json) -> Json:
        return {"item_id": item["id"], "output_index": self.output.index(item)}

    def _text(self, text: str, kind: str = "message") -> list[Json]:
        """``text`` added to the open item of ``kind`` ("message": its output_text; "reasoning": its
        reasoning_text), the other closed and a new one opened as needed."""
        out = [] if self.message is None or self.message["type"] == kind else self._close("completed")
        if self.message is None:
            self.message = _item(kind)
            self.output.append(self.message)
            out += [self._event("response.output_item.added", output_index=len(self.output) - 1,
                                item={**self.message, "content": []}),
                    self._event("response.content_part.added", **self._where(self.message), content_index=0,
                                part=_part("", kind))]
            self.message["content"].append(_part("", kind))
        self.message["content"][0]["text"] += text
        name, extra = _names(kind)
        return [*out, self._event(f"response.{name}.delta", **self._where(self.message), content_index=0,
                                  delta=text, **extra)]

    def _close(self, status: str) -> list[Json]:
        item, self.message = self.message, None
        if item is None:
            return []
        item["status"] = status
        text, where = item["content"][0]["text"], self._where(item)
        kind = item["type"]
        name, extra = _names(kind)
        return [self._event(f"response.{name}.done", **where, content_index=0, text=text, **extra),
                self._event("response.content_part.done", **where, content_index=0, part=_part(text, kind)),
                self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _call(self, call: Call) -> list[Json]:
        item = {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "in_progress",
                "call_id": call.call_id, "name": call.name, "arguments": ""}
        self.output.append(item)
        where = self._where(item)
        out = [self._event("response.output_item.added", output_index=where["output_index"], item=dict(item)),
               self._event("response.function_call_arguments.delta", **where, delta=call.arguments),
               self._event("response.function_call_arguments.done", **where, name=call.name,
                           arguments=call.arguments)]
        item.update(arguments=call.arguments, status="completed")
        return [*out, self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def on(self, piece: Piece) -> list[Json]:
        if isinstance(piece, Thought):
            return self._text(piece.text, "reasoning")
        if isinstance(piece, Text):
            return self._text(piece.text)
        if isinstance(piece, Call):
            return [*self._close("completed"), *self._call(piece)]
        self.end = piece
        status = "incomplete" if piece.finish == "length" else "completed"
        closing = self._close(status)
        return [*closing, self._event(f"response.{status}", response=self._response(status))]

    def failed(self, exc: ApiError) -> list[Json]:
        error = {"code": exc.code or exc.type, "message": str(exc)}
        return [self._event("response.failed", response=self._response("failed", error))]

    def final(self) -> Json:
        return self._response("incomplete" if self.end is not None and self.end.finish == "length" else "completed")


class ResponsesDialect:
    """``POST /v1/responses`` (``service.http.dialect.Dialect``)."""

    prefix = "resp_"
    trailer = b""

    def __init__(self, model: str, limits: InputLimits = DEFAULTS) -> None:
        self.model, self.limits = model, limits

    def frame(self, item: Any) -> bytes:
        return typed_event(item)

    def parse(self, body: bytes, priority: str | None) -> Parsed:
        raw = parse_json(body)
        parsed = parse_responses(raw, self.model, priority, self.limits)
        check_model(raw.get("model"), self.model)
        return parsed

    def _writer(self, answer: Answer, parsed: Parsed) -> ResponseWriter:
        assert isinstance(parsed, ResponsesParsed)
        return ResponseWriter(answer.choices.request_id, self.model, parsed.echo)

    async def complete(self, answer: Answer, run: Run | Runs, parsed: Parsed) -> Json | None:
        return await whole(self._writer(answer, parsed), Turn(answer), run_events(None, run))

    def events(self, answer: Answer, first: pb.GenerateResponse, run: Run | Runs, parsed: Parsed) -> AsyncIterator[Json]:
        return stream(self._writer(answer, parsed), Turn(answer), run_events(first, run))
