"""What an HTTP dialect is to the one generation route, and the OpenAI Chat Completions / Completions dialect.

``HttpApi._generate`` (``service.http.app``) runs every generating request the
same way; a ``Dialect`` supplies only what differs between the OpenAI,
Anthropic Messages and OpenAI Responses APIs:

* ``parse``: the body (bytes) -> the ``GenerateRequest`` and its output plan
  (``Parsed``); runs in a worker thread; raises ApiError 4xx;
* ``complete``: the events of the run -> the unstreamed answer (None: the
  client left);
* ``events``: the events from the first one on -> the streamed answer's
  events, each written with ``frame``, ``trailer`` after the last;
* the error shape: ``error_response`` picks it by the route's path.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from inference.v1 import inference_pb2 as pb
from starlette.responses import Response

from service.api.input_limits import DEFAULTS, InputLimits
from service.http.answer import Answer
from service.http.anthropic_errors import PATH as MESSAGES_PATH
from service.http.anthropic_errors import anthropic_response
from service.http.body import parse_json
from service.http.errors import ApiError
from service.http.render import Json
from service.http.requests import Parsed, parse_chat, parse_completion
from service.http.run import Run
from service.http.runs import Runs
from service.http.sse import DONE, event


class Dialect(Protocol):
    """One HTTP API's body and answer shapes (see the module docstring)."""

    @property
    def prefix(self) -> str: ...  # of the request id
    @property
    def trailer(self) -> bytes: ...  # after the last streamed event
    def frame(self, item: Any) -> bytes: ...
    def parse(self, body: bytes, priority: str | None) -> Parsed: ...
    async def complete(self, answer: Answer, run: Run | Runs, parsed: Parsed) -> Json | None: ...
    def events(self, answer: Answer, first: pb.GenerateResponse, run: Run | Runs, parsed: Parsed) -> AsyncIterator[Any]: ...


def typed_event(payload: Json) -> bytes:
    """One event of the Anthropic and Responses streams: ``event: <its type>`` and its ``data`` line."""
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


def check_model(name: Any, served: str) -> None:
    """ApiError 404 ``model_not_found`` unless ``name`` is the served model's id."""
    if name != served:
        raise ApiError(404, f"The model {name!r} does not exist (this server serves {served!r})",
                       param="model", code="model_not_found")


def error_response(path: str, exc: ApiError) -> Response:
    """``exc`` in the error shape of the dialect that serves ``path`` (OpenAI's unless it is Anthropic's)."""
    if path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/"):
        return anthropic_response(exc)
    return exc.response()


@dataclass(frozen=True)
class OpenAIDialect:
    """Chat Completions (``chat``) or Completions: ``data:`` chunks ending with ``data: [DONE]``."""

    chat: bool
    model: str
    limits: InputLimits = DEFAULTS
    trailer: bytes = DONE

    def frame(self, item: Any) -> bytes:
        return event(item)

    @property
    def prefix(self) -> str:
        return "chatcmpl-" if self.chat else "cmpl-"

    def parse(self, body: bytes, priority: str | None) -> Parsed:
        raw = parse_json(body)
        parsed = (parse_chat if self.chat else parse_completion)(raw, self.model, priority, self.limits)
        check_model(raw.get("model"), self.model)
        return parsed

    async def complete(self, answer: Answer, run: Run | Runs, parsed: Parsed) -> Json | None:
        return await answer.complete(run)

    def events(self, answer: Answer, first: pb.GenerateResponse, run: Run | Runs, parsed: Parsed) -> AsyncIterator[Json]:
        return answer.stream(first, run)
