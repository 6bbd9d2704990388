"""An Anthropic Messages answer: the ``message`` object, or its event stream; the Messages dialect.

A streamed answer is Anthropic's event sequence::

    message_start
    (content_block_start, content_block_delta*, content_block_stop)*   text / tool_use blocks
    message_delta   stop_reason, stop_sequence, usage
    message_stop

or, for a failure after the status line, one ``error`` event (Anthropic's
error object) in place of the end. Text streams as ``text_delta``s; a tool call
(generated whole under its schema, ``service.http.tools``) is one ``tool_use``
block with its input in one ``input_json_delta``. ``stop_reason``: ``end_turn``,
``stop_sequence`` (with the string), ``max_tokens``, ``tool_use``. A reasoning
model's thought comes first, as a ``thinking`` block (``thinking_delta``s, then
a ``signature_delta``): its ``signature`` is always "" (this server has no
signature to give; a thinking block sent back is dropped, not verified).

Usage: ``input_tokens`` are the prompt tokens computed for this request,
``cache_read_input_tokens`` those served from the prefix cache (their sum is
the prompt, as count_tokens counts it), ``cache_creation_input_tokens`` 0. The
prompt's size is known only at the end, so ``message_start`` carries zeros and
``message_delta`` the request's usage (the SDKs take both from it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.api.intake import Intake
from service.http.answer import Answer
from service.http.anthropic_errors import anthropic_error
from service.http.anthropic_messages import count_turns, parse_messages
from service.http.body import parse_json
from service.http.dialect import check_model, typed_event
from service.http.errors import ApiError
from service.http.render import Json
from service.http.requests import Parsed
from service.http.run import Run
from service.http.runs import Runs
from service.http.turn import Call, End, Piece, Text, Thought, Turn, Usage, run_events, stream, whole
from service.request.errors import BadRequest

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def usage(u: Usage) -> Json:
    return {"input_tokens": u.prompt - u.cached, "output_tokens": u.completion,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": u.cached}


class MessageWriter:
    """One turn as Anthropic's message and events (``service.http.turn.Writer``)."""

    def __init__(self, message_id: str, model: str) -> None:
        self.id, self.model = message_id, model
        self.content: list[Json] = []
        self.open = ""  # the type of the open block ("text", "thinking"; "": none)
        self.end: End | None = None

    def _message(self) -> Json:
        end = self.end
        reason = None if end is None else "stop_sequence" if end.stop_sequence is not None \
            else STOP_REASONS.get(end.finish, "end_turn")
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": self.content, "stop_reason": reason, "stop_sequence": end.stop_sequence if end else None,
                "usage": usage(end.usage if end is not None else Usage(0, 0, 0))}

    def start(self) -> list[Json]:
        return [{"type": "message_start", "message": {**self._message(), "content": []}}]

    def _close(self) -> list[Json]:
        if not self.open:
            return []
        i = len(self.content) - 1
        # NOTE: the SDK's stream helper takes a thinking block's signature from its signature_delta
        sign = [{"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": ""}}] \
            if self.open == "thinking" else []
        self.open = ""
        return [*sign, {"type": "content_block_stop", "index": i}]

    def _block(self, kind: str, key: str, text: str) -> list[Json]:
        """``text`` added to the open block of ``kind`` (a new one opened, the other closed, as needed)."""
        out = []
        if self.open != kind:
            out = self._close()
            block = {"type": kind, key: "", **({"signature": ""} if kind == "thinking" else {})}
            self.content.append(dict(block))
            self.open = kind
            out.append({"type": "content_block_start", "index": len(self.content) - 1, "content_block": block})
        self.content[-1][key] += text
        delta = {"type": f"{kind}_delta" if kind == "thinking" else "text_delta", key: text}
        return [*out, {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}]

    def on(self, piece: Piece) -> list[Json]:
        if isinstance(piece, Thought):
            return self._block("thinking", "thinking", piece.text)
        if isinstance(piece, Text):
            return self._block("text", "text", piece.text)
        if isinstance(piece, Call):
            return [*self._close(), *self._tool_use(piece)]
        self.end = piece
        message = self._message()
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
        return [*self._close(), {"type": "message_delta", "delta": delta, "usage": message["usage"]},
                {"type": "message_stop"}]

    def _tool_use(self, call: Call) -> list[Json]:
        block = {"type": "tool_use", "id": "toolu_" + call.call_id.removeprefix("call_"), "name": call.name}
        self.content.append({**block, "input": json.loads(call.arguments)})
        i = len(self.content) - 1
        return [{"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}},
                {"type": "content_block_delta", "index": i,
                 "delta": {"type": "input_json_delta", "partial_json": call.arguments}},
                {"type": "content_block_stop", "index": i}]

    def failed(self, exc: ApiError) -> list[Json]:
        return [{"type": "error", "error": anthropic_error(exc)}]

    def final(self) -> Json:
        return self._message()


class MessagesDialect:
    """``POST /v1/messages`` (``service.http.dialect.Dialect``) and its ``count_tokens``."""

    prefix = "msg_"
    trailer = b""

    def __init__(self, model: str, intake: Intake, limits: InputLimits = DEFAULTS) -> None:
        self.model, self.intake, self.limits = model, intake, limits

    def frame(self, item: Any) -> bytes:
        return typed_event(item)

    def parse(self, body: bytes, priority: str | None) -> Parsed:
        raw = parse_json(body)
        parsed = parse_messages(raw, self.model, priority, self.limits)
        check_model(raw.get("model"), self.model)
        return parsed

    def _turn(self, answer: Answer, parsed: Parsed) -> Turn:
        return Turn(answer, tuple(parsed.request.sampling.stop), self.intake.builder.vocab.token_bytes)

    async def complete(self, answer: Answer, run: Run | Runs, parsed: Parsed) -> Json | None:
        writer = MessageWriter(answer.choices.request_id, self.model)
        return await whole(writer, self._turn(answer, parsed), run_events(None, run))

    def events(self, answer: Answer, first: pb.GenerateResponse, run: Run | Runs, parsed: Parsed) -> AsyncIterator[Json]:
        writer = MessageWriter(answer.choices.request_id, self.model)
        return stream(writer, self._turn(answer, parsed), run_events(first, run))

    def count_tokens(self, body: bytes) -> Json:
        """Worker thread: ``{"input_tokens": n}``, the prompt's tokens as Generate would count them."""
        raw = parse_json(body)
        turns, tools, kwargs = count_turns(raw, self.limits)
        check_model(raw.get("model"), self.model)
        try:
            return {"input_tokens": len(self.intake.builder.render_tokens("", turns, tools=tools, kwargs=kwargs)[1])}
        except BadRequest as exc:
            raise ApiError(400, str(exc)) from None
