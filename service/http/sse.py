"""Server-sent events for streamed answers: ``data: {json}`` per chunk, ``data: [DONE]`` last.

A failure after the stream has started (the status line is already sent) is
one ``data: {"error": {...}}`` event before ``[DONE]``, which the OpenAI SDKs
raise as an ``APIError``. The response watches the connection: a client that
goes away aborts the request (``Run.abort``), even while it waits in the queue
or its stream is paused.

Other dialects frame their events their own way (``frame``: Anthropic's and
the Responses API's ``event: <type>`` lines) and send no ``[DONE]``
(``trailer`` empty); they end with their own terminal event instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.http.errors import ApiError
from service.http.run import Abortable

log = logging.getLogger("service.http")
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # NOTE: tells nginx-style proxies not to buffer the stream
]
DONE = b"data: [DONE]\n\n"


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class EventStream(Response):
    """An SSE response over ``chunks``; ``watcher`` is the request's disconnect watch (cancelled at the end)."""

    def __init__(self, chunks: AsyncIterator[Any], run: Abortable, watcher: asyncio.Task[None],
                 frame: Callable[[Any], bytes] = event, trailer: bytes = DONE) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.chunks, self.run, self.watcher = chunks, run, watcher
        self.frame, self.trailer = frame, trailer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            await self._body(send)
            await send({"type": "http.response.body", "body": self.trailer, "more_body": False})
        except OSError:  # the client went away while we wrote (uvicorn's ClientDisconnected)
            log.debug("stream client disconnected")
        finally:
            self.watcher.cancel()
            self.run.abort()

    async def _body(self, send: Send) -> None:
        try:
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": self.frame(chunk), "more_body": True})
        except ApiError as exc:
            await send({"type": "http.response.body", "body": event(exc.body()), "more_body": True})
