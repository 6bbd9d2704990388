"""One HTTP request in the lifecycle: its ``Ask`` runs as a flight, its events come back in order.

The HTTP API prepares and submits nothing itself: it translates the body into
the ``GenerateRequest`` a gRPC client would send, and runs it through the same
lifecycle (``Intake.start``: preparation, the response cache, quotas, fair
share, ``n`` choices, exactly one terminal event). ``Run`` queues the events as
protos for the answer writer and measures how far the client is behind: past
``backlog_high`` unread events the flight pauses, and a client that stays that
far behind for ``stall_timeout_s`` has its request cancelled
(``service.api.stream_backlog``). HTTP requests have no deadline.

A client that goes away is seen at once: ``watch_disconnect`` waits on the
ASGI ``receive`` channel (which reports ``http.disconnect`` as soon as the
connection closes) and aborts the request, so its sequences leave the engine
at its next step, whether the request was queued, running or paused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from inference.v1 import inference_pb2 as pb

from service.api.ask import Ask
from service.api.intake import Intake
from service.api.proto_convert import event_proto
from service.api.stream_backlog import Backlog, StreamLimits
from service.request.events import Error, Event

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class Abortable(Protocol):
    """What ends when the client leaves: a ``Run``, or the runs of several prompts (``service.http.runs``)."""

    def abort(self) -> None: ...


class Run:
    """The events of one request; ``abort`` cancels it (idempotent) and ends ``events``."""

    def __init__(self, intake: Intake, limits: StreamLimits, request_id: str, request: pb.GenerateRequest,
                 prompt_ids: tuple[int, ...] = ()) -> None:
        request.request_id = self.request_id = request_id
        self.limits = limits
        self.queue: asyncio.Queue[pb.GenerateResponse | None] = asyncio.Queue()
        self.aborted = False
        self.flight = intake.start(Ask.generate(request, None, prompt_ids), self._on_event)
        self.backlog = Backlog(limits, False, self.flight.pause, self._on_stall)

    def _on_event(self, event: Event, terminal: bool) -> None:
        if self.aborted:
            return
        self.queue.put_nowait(event_proto(self.request_id, event))
        self.backlog.on_produced()
        if terminal:
            self.queue.put_nowait(None)

    def _on_stall(self) -> None:
        message = f"cancelled: the client did not read its stream for {self.limits.stall_timeout_s:g} s"
        self.flight.cancel(Error("CANCELLED", message))

    async def next(self) -> pb.GenerateResponse | None:
        """The next Delta/Done/Error proto; None after the terminal event (or an abort)."""
        item = await self.queue.get()
        if item is None:
            self.queue.put_nowait(None)  # every later call sees the end too
        else:
            self.backlog.on_sent()
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
        self.backlog.cancel_stall()
        self.flight.cancel()
        self.queue.put_nowait(None)


def watch_disconnect(receive: Receive, run: Abortable) -> asyncio.Task[None]:
    """A task that aborts ``run`` when the client disconnects; cancel it once the response is sent."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        run.abort()

    return asyncio.get_running_loop().create_task(watch())
