"""The Generate calls (legs) of one sync stream: their outboxes and reader threads.

Each open call has an ``Outbox`` (the request iterator gRPC consumes) and, once
the stream is iterated, a reader thread that puts ``(leg, response)`` items, then
one terminal item (``END`` or the ``grpc.RpcError``), into one bounded ``inbox``.

NOTE: the inbox holds at most ``READ_AHEAD`` responses: a caller that stops
iterating stops the readers too, so gRPC's own flow control still applies, and
the acknowledgements the stream sends (``_mux.Leg.ack_due``) count what the
caller has actually taken.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb

from ._mux import Leg, accepts_acks

END = object()  # a call's normal end
READ_AHEAD = 16  # responses read from gRPC before the caller takes them
IDLE_ACK_S = 0.05  # the caller acknowledges what it read after waiting this long for more


class Outbox:
    """The request iterator handed to gRPC: blocks for messages until closed."""

    _CLOSE = object()

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, msg: pb.GenerateRequest) -> None:
        self._queue.put(msg)

    def close(self) -> None:
        self._queue.put(self._CLOSE)

    def __iter__(self) -> Iterator[pb.GenerateRequest]:
        return self

    def __next__(self) -> pb.GenerateRequest:
        item = self._queue.get()
        if item is self._CLOSE:
            raise StopIteration
        return item


@dataclass
class _Open:
    call: Any
    outbox: Outbox
    reader: threading.Thread | None = None
    closed: bool = field(default=False)


def _offer(inbox: queue.Queue[tuple[Leg, Any]], item: tuple[Leg, Any], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            inbox.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


def _read(leg: Leg, call: Any, inbox: queue.Queue[tuple[Leg, Any]], stop: threading.Event) -> None:
    """Reader thread: every response of ``call``, then its terminal item."""
    end: Any = END
    try:
        # NOTE: set before the first response is queued, so the caller sees it when it reads that one
        leg.acks = accepts_acks(call.initial_metadata())
        for resp in call:
            _offer(inbox, (leg, resp), stop)
    except grpc.RpcError as exc:
        end = exc
    _offer(inbox, (leg, end), stop)


class CallSet:
    """The open calls of a stream, by leg (callers hold the stream's lock)."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[tuple[Leg, Any]] = queue.Queue(maxsize=READ_AHEAD)
        self._open: dict[Leg, _Open] = {}
        self._stop = threading.Event()
        self._reading = False

    def __contains__(self, leg: Leg) -> bool:
        return leg in self._open

    def __bool__(self) -> bool:
        return bool(self._open)

    def add(self, leg: Leg, call: Any, outbox: Outbox) -> None:
        self._open[leg] = _Open(call, outbox)
        if self._reading:
            self.start_reader(leg)

    def start_readers(self) -> None:
        """The stream is being iterated: read every open call (and those opened later)."""
        self._reading = True
        for leg in list(self._open):
            self.start_reader(leg)

    def start_reader(self, leg: Leg) -> None:
        entry = self._open.get(leg)
        if entry is None or entry.reader is not None:
            return
        entry.reader = threading.Thread(
            target=_read, args=(leg, entry.call, self.inbox, self._stop), name="generate-reader", daemon=True
        )
        entry.reader.start()

    def send(self, leg: Leg, msg: pb.GenerateRequest) -> None:
        entry = self._open.get(leg)
        if entry is not None and not entry.closed:
            entry.outbox.put(msg)

    def half_close(self, leg: Leg) -> None:
        entry = self._open.get(leg)
        if entry is not None and not entry.closed:
            entry.closed = True
            entry.outbox.close()

    def discard(self, leg: Leg) -> None:
        """``leg``'s call ended (its reader delivered the terminal item)."""
        entry = self._open.pop(leg, None)
        if entry is not None and not entry.closed:
            entry.outbox.close()

    def cancel_all(self) -> None:
        """Cancel every call and stop the readers (the stream is finished)."""
        self._stop.set()
        for entry in list(self._open.values()):
            if not entry.closed:
                entry.closed = True
                entry.outbox.close()
            entry.call.cancel()  # no-op when the RPC already ended

    def close_outboxes(self) -> None:
        """Release gRPC's request-consumer threads of a stream that is dropped unread."""
        for entry in list(self._open.values()):
            entry.outbox.close()
