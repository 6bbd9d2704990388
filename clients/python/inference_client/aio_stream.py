"""Asyncio Generate streams, mirroring ``stream.py`` on ``grpc.aio``.

The RPC opens lazily on the first ``submit``, ``close`` or iteration, inside
the running event loop; requests registered before that are sent when it opens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import grpc
import grpc.aio
from inference.v1 import inference_pb2 as pb

from ._mux import MuxState
from .errors import InferenceError
from .events import Delta, Done, ErrorEvent, Event, Result, StreamEvent
from .retry import Deadline, RetryPolicy
from .spec import RequestSpec
from .stream import StreamRegistry, new_request_id


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
        self._metadata = metadata
        self._registry = registry
        self._state = MuxState(policy, Deadline(timeout))
        self._call: Any = None
        self._lock = asyncio.Lock()  # serializes writes, opening and half-closing
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished = False
        self._iterated = False
        self.request_ids: list[str] = []

    def add(self, spec: RequestSpec | str) -> str:
        """Register a request to be sent when the stream opens (before first use only)."""
        if self._call is not None:
            raise RuntimeError("the stream is open; use `await submit(...)`")
        return self._register(spec)

    def seal(self) -> None:
        """Close for submissions before first use (the sync twin of ``close``)."""
        if self._call is not None:
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
            if self._call is not None:
                await self._write(self._state.entries[request_id].message)
            return request_id

    async def cancel(self, request_id: str) -> bool:
        """Ask the server to cancel ``request_id``; False if it is not in flight here."""
        async with self._lock:
            msg = self._state.cancel(request_id)
            if msg is not None and self._call is not None and not self._finished:
                await self._write(msg)
            return request_id in self._state.entries

    async def close(self) -> None:
        """No more submissions; the stream ends once the in-flight requests finished."""
        self._state.closed = True
        await self._ensure_open()
        async with self._lock:
            await self._maybe_half_close()

    async def abort(self) -> None:
        """Cancel the RPC now; in-flight requests are cancelled by the server."""
        self._shutdown()

    def in_flight(self) -> list[str]:
        """Ids of the requests that have not finished yet."""
        return self._state.unfinished()

    async def _ensure_open(self) -> None:
        async with self._lock:
            if self._call is None and not self._finished:
                await self._open()

    async def _open(self) -> None:
        timeout = self._state.deadline.check(self._state.stream_attempts - 1)
        self._call = self._stub.Generate(timeout=timeout, metadata=self._metadata)
        for msg in self._state.replay():
            await self._write(msg)
        await self._maybe_half_close()

    async def _write(self, msg: pb.GenerateRequest) -> None:
        # A failed write means the RPC ended; the reader sees why and retries or raises.
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._call.write(msg)

    async def _maybe_half_close(self) -> None:
        if self._call is not None and self._state.should_half_close():
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self._call.done_writing()

    def __aiter__(self) -> AsyncGenerator[tuple[str, StreamEvent], None]:
        if self._iterated:
            raise RuntimeError("an AsyncGenerateStream can be iterated only once")
        self._iterated = True
        return self._events()

    async def _events(self) -> AsyncGenerator[tuple[str, StreamEvent], None]:
        await self._ensure_open()
        try:
            while True:
                try:
                    resp = await self._call.read()
                except grpc.RpcError as exc:
                    if await self._reopen(exc):
                        continue
                    attempts = self._state.stream_attempts
                    raise InferenceError.from_rpc_error(exc, attempts=attempts) from None
                if resp is grpc.aio.EOF:
                    break
                for item in await self._deliver(resp):
                    yield item
            for request_id in self._state.unfinished():
                err = InferenceError(
                    grpc.StatusCode.INTERNAL,
                    "stream ended before the request finished",
                    request_id=request_id,
                )
                yield request_id, ErrorEvent(err)
        finally:
            self._shutdown()

    async def _deliver(self, resp: pb.GenerateResponse) -> list[tuple[str, StreamEvent]]:
        outcome = self._state.on_response(resp)
        if outcome is None:
            return []
        if outcome.retry_after is not None:
            self._spawn(self._resend(outcome.request_id, outcome.retry_after))
        if outcome.terminal and self._registry is not None:
            self._registry.discard(outcome.request_id, self)
        async with self._lock:
            await self._maybe_half_close()
        return [] if outcome.event is None else [(outcome.request_id, outcome.event)]

    async def _reopen(self, exc: grpc.RpcError) -> bool:
        wait = self._state.on_stream_error(exc)
        if wait is None:
            return False
        await asyncio.sleep(wait)
        async with self._lock:
            await self._open()
        return True

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resend(self, request_id: str, wait: float) -> None:
        await asyncio.sleep(wait)
        async with self._lock:
            if not self._finished:
                for msg in self._state.resend(request_id):
                    await self._write(msg)

    def _shutdown(self) -> None:
        if self._finished:
            return
        self._finished = True
        for task in self._tasks:
            task.cancel()
        if self._call is not None:
            self._call.cancel()  # no-op when the RPC already ended
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


class _Finish:
    done: Done | None = None


async def _single(stream: AsyncGenerateStream, finish: _Finish) -> AsyncGenerator[Event, None]:
    events = stream.__aiter__()
    try:
        async for _, event in events:
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, Done):
                finish.done = event
            yield event
    finally:
        await events.aclose()


class AsyncGeneration:
    """One request on its own stream: ``async for event in generation`` (``Delta``..., ``Done``).

    An ``error`` event raises :class:`InferenceError`; ``await cancel()`` ends
    the request with ``Done(finish_reason="cancelled")``. To stop early,
    ``await aclose()`` (or ``async with``); an abandoned one is cancelled when
    garbage-collected.
    """

    def __init__(self, stream: AsyncGenerateStream, request_id: str) -> None:
        self.request_id = request_id
        self._stream = stream
        self._finish = _Finish()
        self._events = _single(stream, self._finish)  # no reference to self: see generation.Generation

    @property
    def done(self) -> Done | None:
        """The final event, once the request completed."""
        return self._finish.done

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        return await anext(self._events)

    async def cancel(self) -> bool:
        """Cancel the request; False if it already finished."""
        return await self._stream.cancel(self.request_id)

    async def aclose(self) -> None:
        """Stop iterating and cancel the RPC if the request is still running."""
        await self._events.aclose()
        await self._stream.abort()

    async def result(self) -> Result:
        """Consume the remaining events; return the collected result (raises on error)."""
        result = Result(self.request_id)
        async for event in self:
            result.add(event)
        result.done = self.done
        return result

    async def text(self) -> str:
        """Consume the remaining events; return the generated text."""
        return "".join([e.text async for e in self if isinstance(e, Delta)])

    async def __aenter__(self) -> AsyncGeneration:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
