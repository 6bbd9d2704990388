"""Sync view of one request on its own Generate stream: events, ``cancel()``, ``close()``."""

from __future__ import annotations

from collections.abc import Generator, Iterator

from .events import Delta, Done, ErrorEvent, Event, Result
from .stream import GenerateStream


class _Finish:
    """Where a single-request iteration records its ``Done`` (kept apart to avoid a reference cycle)."""

    done: Done | None = None


def _single(stream: GenerateStream, finish: _Finish) -> Generator[Event, None, None]:
    events = stream.__iter__()
    try:
        for _, event in events:
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, Done):
                finish.done = event
            yield event
    finally:
        events.close()


class Generation:
    """One request on its own stream: an iterator of ``Delta`` events then a ``Done``.

    An ``error`` event raises :class:`InferenceError`. :meth:`cancel` (from
    any thread, or inside the loop) makes the request end with
    ``Done(finish_reason="cancelled")``. To stop early, ``close()`` it (or use
    ``with``); an abandoned Generation cancels its RPC when garbage-collected,
    which for a temporary (``for e in client.generate(...): break``) is at once.
    """

    def __init__(self, stream: GenerateStream, request_id: str) -> None:
        self.request_id = request_id
        self._stream = stream
        self._finish = _Finish()
        # NOTE: the generator must not reference ``self``: without a cycle, dropping the
        # Generation finalizes the generator immediately, which cancels the RPC.
        self._events = _single(stream, self._finish)

    @property
    def done(self) -> Done | None:
        """The final event, once the request completed."""
        return self._finish.done

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        return next(self._events)

    def cancel(self) -> bool:
        """Cancel the request; False if it already finished."""
        return self._stream.cancel(self.request_id)

    def close(self) -> None:
        """Stop iterating and cancel the RPC if the request is still running."""
        self._events.close()
        self._stream.abort()

    def result(self) -> Result:
        """Consume the remaining events; return the collected result (raises on error)."""
        result = Result(self.request_id)
        for event in self:
            result.add(event)
        result.done = self.done
        return result

    def text(self) -> str:
        """Consume the remaining events; return the generated text."""
        return "".join(e.text for e in self if isinstance(e, Delta))

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
