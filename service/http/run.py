"""One HTTP request in the engine: a one-request ``GenerateStream`` over the shared ``Intake``.

The HTTP API does not prepare or submit anything itself: it hands the
``GenerateRequest`` it built to the same ``GenerateStream`` the gRPC
``Generate`` RPC uses (preparation, the response cache, quotas, fair share,
``n`` choices, backpressure on an unread stream, exactly one terminal event),
and reads the stream's protos back.

A client that goes away is seen at once: ``watch_disconnect`` waits on the
ASGI ``receive`` channel (which reports ``http.disconnect`` as soon as the
connection closes) and aborts the request, so its sequences leave the engine
at its next step, whether the request was queued, running or paused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.generate_stream import GenerateStream, StreamLimits
from service.api.intake import Intake

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class _NoDeadline:
    """What ``GenerateStream`` reads of a gRPC context: no deadline, no call metadata (no stream acks)."""

    def time_remaining(self) -> None:
        return None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


class Run:
    """The events of one request; ``abort`` cancels it (idempotent) and ends ``events``."""

    def __init__(self, intake: Intake, limits: StreamLimits, request_id: str, request: pb.GenerateRequest) -> None:
        request.request_id = self.request_id = request_id
        self.stream = GenerateStream(intake, _NoDeadline(), limits)
        self.stream.on_request(request)  # NOTE: schedules its preparation on this event loop
        self.stream.reading = False  # no second request: the stream closes after this one's end
        self.aborted = False

    async def next(self) -> pb.GenerateResponse | None:
        """The next Delta/Done/Error proto; None after the terminal event (or an abort)."""
        item = await self.stream.out.get()
        if item is None:
            self.stream.out.put_nowait(None)  # every later call sees the end too
        else:
            self.stream.on_sent()
        return item

    async def events(self) -> AsyncIterator[pb.GenerateResponse]:
        """The remaining events, up to the request's terminal event (or an abort)."""
        while (item := await self.next()) is not None:
            yield item

    def abort(self) -> None:
        """The client left (or the response ended): cancel whatever still runs and end ``events``."""
        if self.aborted:
            return
        self.aborted = True
        self.stream.abort_all()
        self.stream.out.put_nowait(None)


def watch_disconnect(receive: Receive, run: Run) -> asyncio.Task[None]:
    """A task that aborts ``run`` when the client disconnects; cancel it once the response is sent."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        run.abort()

    return asyncio.get_running_loop().create_task(watch())
