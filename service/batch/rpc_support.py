"""What BatchService RPCs share beyond the store: store outages as UNAVAILABLE, progress rates.

* ``store_errors`` wraps a servicer method (unary or server-streaming): a
  ``StoreUnavailable`` from the store (database down, link cut, store not open
  yet) ends the call with UNAVAILABLE and a ``retry-after-ms`` hint, which the
  clients' retry policy honours; the cause is logged here, not sent (it names
  the database's address).
* ``ProgressRate``: items finished per second from a job's successive counts,
  as one WatchBatch stream sees them (every replica's work, unlike the local
  worker's rate).
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc

from service.batch.store import Counts, StoreUnavailable

log = logging.getLogger("service.batch")
RETRY_AFTER_MS = 1000
UNAVAILABLE_MESSAGE = StoreUnavailable.public_message
F = TypeVar("F", bound=Callable[..., Any])


async def abort_unavailable(context: grpc.aio.ServicerContext, exc: Exception, message: str = "") -> None:
    """End the call with UNAVAILABLE and a retry hint (raises)."""
    log.info("batch call answered UNAVAILABLE: %s", exc)
    await context.abort(
        grpc.StatusCode.UNAVAILABLE, message or UNAVAILABLE_MESSAGE,
        trailing_metadata=(("retry-after-ms", str(RETRY_AFTER_MS)),),
    )


def store_errors(method: F) -> F:
    """``method(self, request, context)`` with StoreUnavailable turned into UNAVAILABLE."""
    if inspect.isasyncgenfunction(method):
        stream = cast(Callable[..., AsyncIterator[Any]], method)

        @functools.wraps(method)
        async def streaming(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for message in stream(self, request, context):
                    yield message
            except StoreUnavailable as exc:
                await abort_unavailable(context, exc)

        return cast(F, streaming)
    call = cast(Callable[..., Awaitable[Any]], method)

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await call(self, request, context)
        except StoreUnavailable as exc:
            await abort_unavailable(context, exc)

    return cast(F, unary)


def finished(counts: Counts) -> int:
    return counts.completed + counts.failed + counts.cancelled


class ProgressRate:
    """Items finished per second over the last ``window_s``, from (time, finished count) samples."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, counts: Counts) -> float:
        """Record the job's counts now; the rate since the oldest sample in the window (0 at first)."""
        now = time.monotonic()
        self._samples.append((now, finished(counts)))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
