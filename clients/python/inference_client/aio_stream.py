"""Asyncio Generate streams, mirroring ``stream.py`` on ``grpc.aio``.

The RPC opens lazily on the first ``submit``, ``close`` or iteration, inside
the running event loop; requests registered before that are sent when it opens.
While the stream is iterated, one reader task per Generate call (leg, see
``_mux.py``) feeds a small bounded queue, as the sync stream's reader threads do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import grpc
import grpc.aio
from inference.v1 import inference_pb2 as pb

from ._legs import END, IDLE_ACK_S, READ_AHEAD
from ._mux import ACKS_METADATA, Leg, MuxState, accepts_acks
from .aio_generation import AsyncGeneration
from .errors import InferenceError
from .events import ErrorEvent, Result, StreamEvent
from .retry import Deadline, RetryPolicy
from .spec import RequestSpec
from .stream import StreamRegistry, new_request_id

__all__ = ["AsyncGenerateStream", "AsyncGeneration"]


async def _read(leg: Leg, call: Any, inbox: asyncio.Queue[tuple[Leg, Any]]) -> None:
    """Reader task: every response of ``call``, then its terminal item (``END`` or the RpcError)."""
    end: Any = END
    try:
        leg.acks = accepts_acks(await call.initial_metadata())
        while (resp := await call.read()) is not grpc.aio.EOF:
            await inbox.put((leg, resp))
    except grpc.RpcError as exc:
        end = exc
    await inbox.put((leg, end))


class AsyncGenerateStream:
    """One Generate RPC carrying many requests; ``async for (request_id, event) in stream``.

    Same contract as the sync :class:`~inference_client.stream.GenerateStream`.
    """

    def __init__(
        self,
        stub: Any,
        *,
        policy: RetryPolicy,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] | None = None,
        registry: StreamRegistry | None = None,
    ) -> None:
        self._stub = stub
        self._metadata = [*(metadata or ()), ACKS_METADATA]
        self._registry = registry
        self._state = MuxState(policy, Deadline(timeout))
        self._calls: dict[Leg, Any] = {}
        self._inbox: asyncio.Queue[tuple[Leg, Any]] | None = None
        self._lock = asyncio.Lock()  # serializes writes, opening and half-closing
        self._tasks: set[asyncio.Task[None]] = set()
        self._readers: dict[Leg, asyncio.Task[None]] = {}
        self._started = False  # opened once (the first leg's call exists or existed)
        self._finished = False
        self._iterated = False
        self.request_ids: list[str] = []

    def add(self, spec: RequestSpec | str) -> str:
        """Register a request to be sent when the stream opens (before first use only)."""
        if self._started:
            raise RuntimeError("the stream is open; use `await submit(...)`")
        return self._register(spec)

    def seal(self) -> None:
        """Close for submissions before first use (the sync twin of ``close``)."""
        if self._started:
            raise RuntimeError("the stream is open; use `await close()`")
        self._state.closed = True

    def _register(self, spec: RequestSpec | str) -> str:
        if isinstance(spec, str):
            spec = RequestSpec(prompt=spec)
        request_id = spec.request_id or new_request_id()
        if self._finished:
            raise ValueError("the stream has finished")
        self._state.register(spec.to_proto(request_id))
        self.request_ids.append(request_id)
        if self._registry is not None:
            self._registry.add(request_id, self)
        return request_id

    async def submit(self, spec: RequestSpec | str) -> str:
        """Send a new request (a spec or a bare prompt); return its request id."""
        async with self._lock:
            request_id = self._register(spec)
            if self._started:
                await self._write(self._state.current, self._state.entries[request_id].message)
            return request_id

    async def cancel(self, request_id: str) -> bool:
        """Ask the server to cancel ``request_id``; False if it is not in flight here."""
        async with self._lock:
            found = self._state.cancel(request_id)
            if found is not None and self._started and not self._finished:
                await self._write(*found)
            return request_id in self._state.entries

    async def close(self) -> None:
        """No more submissions; the stream ends once the in-flight requests finished."""
        self._state.closed = True
        await self._ensure_open()
        async with self._lock:
            await self._maybe_half_close(self._state.current)

    async def abort(self) -> None:
        """Cancel the RPC now; in-flight requests are cancelled by the server."""
        self._shutdown()

    def in_flight(self) -> list[str]:
        """Ids of the requests that have not finished yet."""
        return self._state.unfinished()

    async def _ensure_open(self) -> None:
        async with self._lock:
            if not self._started and not self._finished:
                self._started = True
                self._inbox = asyncio.Queue(maxsize=READ_AHEAD)
                await self._open(self._state.current)

    async def _open(self, leg: Leg) -> None:
        """Start (or restart) ``leg``'s call with the messages sent on it so far."""
        timeout = self._state.deadline.check(leg.attempts - 1)
        self._calls[leg] = self._stub.Generate(timeout=timeout, metadata=self._metadata)
        for msg in list(leg.log):
            await self._write(leg, msg)
        if self._iterated:
            self._start_reader(leg)
        await self._maybe_half_close(leg)

    def _start_reader(self, leg: Leg) -> None:
        assert self._inbox is not None
        task = asyncio.get_running_loop().create_task(_read(leg, self._calls[leg], self._inbox))
        self._readers[leg] = task

    async def _write(self, leg: Leg, msg: pb.GenerateRequest) -> None:
        # A failed write means the RPC ended; the reader sees why and retries or raises.
        call = self._calls.get(leg)
        if call is not None and not leg.half_closed:
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await call.write(msg)

    async def _maybe_half_close(self, leg: Leg) -> None:
        call = self._calls.get(leg)
        if call is not None and self._state.should_half_close(leg):
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await call.done_writing()

    def __aiter__(self) -> AsyncGenerator[tuple[str, StreamEvent], None]:
        if self._iterated:
            raise RuntimeError("an AsyncGenerateStream can be iterated only once")
        self._iterated = True
        return self._events()

    async def _events(self) -> AsyncGenerator[tuple[str, StreamEvent], None]:
        await self._ensure_open()
        try:
            for leg in list(self._calls):
                self._start_reader(leg)
            while self._calls:
                leg, item = await self._next()
                if item is END or isinstance(item, grpc.RpcError):
                    for pair in await self._leg_ended(leg, item):
                        yield pair
                else:
                    for pair in await self._deliver(leg, item):
                        yield pair
        finally:
            self._shutdown()

    async def _next(self) -> tuple[Leg, Any]:
        """The next item of any call; after IDLE_ACK_S without one, acknowledge what was read first."""
        assert self._inbox is not None
        try:
            return await asyncio.wait_for(self._inbox.get(), IDLE_ACK_S)
        except TimeoutError:
            async with self._lock:
                for leg in list(self._state.legs):
                    if (ack := leg.ack_due(idle=True)) is not None:
                        await self._write(leg, ack)
            return await self._inbox.get()

    async def _deliver(self, leg: Leg, resp: pb.GenerateResponse) -> list[tuple[str, StreamEvent]]:
        async with self._lock:
            outcome = self._state.on_response(leg, resp)
            if (ack := leg.ack_due()) is not None:
                await self._write(leg, ack)
            if outcome is None:
                return []
            if outcome.retry_after is not None:
                self._spawn(self._resend(outcome.request_id, outcome.retry_after))
            if outcome.move:
                await self._send_moved()
            if outcome.terminal and self._registry is not None:
                self._registry.discard(outcome.request_id, self)
            await self._maybe_half_close(leg)
        return [] if outcome.event is None else [(outcome.request_id, outcome.event)]

    async def _send_moved(self) -> None:
        """Send the moved requests on the current leg, opening its call first if it has none."""
        leg = self._state.current
        msgs = self._state.take_moved()
        if leg in self._calls:
            for msg in msgs:
                await self._write(leg, msg)
        else:
            await self._open(leg)  # its log holds the moved messages

    async def _leg_ended(self, leg: Leg, item: Any) -> list[tuple[str, StreamEvent]]:
        """A call ended: re-open it (failed before any response), or end its unfinished requests."""
        exc = item if isinstance(item, grpc.RpcError) else None
        self._calls.pop(leg, None)
        self._readers.pop(leg, None)
        wait = self._state.on_leg_error(leg, exc) if exc is not None else None
        if wait is not None:
            await asyncio.sleep(wait)
            async with self._lock:
                await self._open(leg)
            return []
        current = leg is self._state.current
        lost = self._state.end_leg(leg)
        if exc is not None and current:
            raise InferenceError.from_rpc_error(exc, attempts=leg.attempts) from None
        return [(rid, ErrorEvent(self._lost(rid, exc))) for rid in lost]

    def _lost(self, request_id: str, exc: grpc.RpcError | None) -> InferenceError:
        """The error of a request whose call ended before it finished."""
        if self._registry is not None:
            self._registry.discard(request_id, self)
        if exc is None:
            return InferenceError(
                grpc.StatusCode.INTERNAL, "stream ended before the request finished", request_id=request_id
            )
        err = InferenceError.from_rpc_error(exc)
        err.request_id = request_id
        return err

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resend(self, request_id: str, wait: float) -> None:
        await asyncio.sleep(wait)
        async with self._lock:
            if not self._finished:
                leg, msgs = self._state.resend(request_id)
                for msg in msgs:
                    await self._write(leg, msg)

    def _shutdown(self) -> None:
        if self._finished:
            return
        self._finished = True
        for task in [*self._tasks, *self._readers.values()]:
            task.cancel()
        for call in self._calls.values():
            call.cancel()  # no-op when the RPC already ended
        if self._registry is not None:
            for request_id in self._state.unfinished():
                self._registry.discard(request_id, self)

    async def collect(self) -> dict[str, Result]:
        """Iterate to the end; return each request's :class:`Result`, in submission order."""
        results: dict[str, Result] = {rid: Result(rid) for rid in self.request_ids}
        async for request_id, event in self:
            results.setdefault(request_id, Result(request_id)).add(event)
        return results

    async def __aenter__(self) -> AsyncGenerateStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._shutdown()
