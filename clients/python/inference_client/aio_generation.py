"""Asyncio view of one request on its own Generate stream (``async for``, ``cancel()``, ``aclose()``)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from .events import Delta, Done, ErrorEvent, Event, Result, StreamEvent


class AsyncGenerateStream(Protocol):
    """What a generation needs of its stream (``aio_stream.AsyncGenerateStream``)."""

    def __aiter__(self) -> AsyncGenerator[tuple[str, StreamEvent], None]: ...

    async def cancel(self, request_id: str) -> bool: ...

    async def abort(self) -> None: ...


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
