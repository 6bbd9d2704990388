"""How far behind its client a Generate stream is, and when its requests pause (``--stream-backlog``).

The backlog is the number of response messages the client has not read yet:

* a client that **acknowledges** (call metadata ``inference-stream-acks: 1``, then
  ``GenerateRequest.ack`` = messages it has read, sent at least every 16 messages
  and whenever it has read all it received) is measured exactly: messages
  produced minus messages acknowledged;
* any other client is measured by what the transport has taken: messages
  produced minus messages whose write completed. Writes stop completing once
  the client's receive window and a few KiB on the server's side are full
  (``service.api.unsent``: without it the kernel's send buffer took megabytes).

NOTE: the second measure misses what gRPC's HTTP/2 flow-control windows hold.
A grpc C-core client grows its receive window with its bandwidth estimate
(BDP probing) whether or not the application reads: measured here, a client that
never read its stream kept accepting writes past 1.5 MB in 60 s of generation,
and 3.8-4.7 MB when written as fast as it took them (with
``grpc.http2.bdp_probe=0``: 89 KB). Only acknowledgements say what the application
has read, so the Python client sends them; other clients get the transport
measure (the bounds: docs/operations.md, "Clients that stop reading").

At ``high`` the stream's requests pause (``on_pause(True)``); at ``low`` or below
they resume (``on_pause(False)``); a stream paused for ``stall_timeout_s`` gets
``on_stall()`` (its requests are cancelled). Event loop only.

A write that has been pending ``write_pending_s`` (``on_write`` ... ``on_sent``, 0 = off) pauses the
stream too, whatever the count; it resumes once that write completes and the count is at ``low``
or below. NOTE: the count alone bit only ``high`` messages after the transport stopped taking
writes, and those messages come at the engine's pace for the stream: with 16 such streams sharing
the engine (about 4 tokens a second each) that was another minute of rows taken from every
neighbour before the pause, and the stall timeout only starts at the pause. A write pending for
a second means the client's window (or receive buffer) is full: it has a window's worth it has not
read, so pausing costs a reader nothing it would notice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger("service.rpc")

ACKS_METADATA_KEY = "inference-stream-acks"  # value "1": the client sends GenerateRequest.ack


@dataclass(frozen=True)
class StreamLimits:
    """Backpressure of one Generate stream (see the module docstring)."""

    backlog_high: int = 256
    backlog_low: int = 64
    stall_timeout_s: float = 60.0
    write_pending_s: float = 1.0  # a write pending this long pauses the stream (0: only the count does)


def acknowledges(metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """Does the call's client send ``GenerateRequest.ack`` (metadata ``inference-stream-acks: 1``)?"""
    for key, value in metadata or ():
        if key == ACKS_METADATA_KEY:
            return value in ("1", b"1")
    return False


class Backlog:
    """Counts a stream's messages and decides pause, resume and stall (see the module docstring)."""

    def __init__(
        self,
        limits: StreamLimits,
        acks: bool,
        on_pause: Callable[[bool], None],
        on_stall: Callable[[], None],
    ) -> None:
        self.limits = limits
        self.acks = acks  # the client acknowledges (and can still: it has not half-closed)
        self.on_pause, self.on_stall = on_pause, on_stall
        self.produced = 0  # messages queued for the client
        self.sent = 0  # messages whose write completed
        self.acked = 0  # messages the client says it has read
        self.paused = False
        self.writing_since: float | None = None  # loop time the pending write started
        self.write_stuck = False  # that write has been pending ``write_pending_s``
        self._stall: asyncio.TimerHandle | None = None
        self._pending: asyncio.TimerHandle | None = None

    @property
    def value(self) -> int:
        """Messages the client has not read yet (the measure of the module docstring)."""
        return self.produced - (self.acked if self.acks else self.sent)

    def on_produced(self) -> None:
        self.produced += 1
        self._update()

    def on_write(self) -> None:
        """A write of one message to the transport started; ``on_sent`` when it completes."""
        loop = asyncio.get_running_loop()
        self.writing_since = loop.time()
        if self._pending is None and self.limits.write_pending_s > 0:
            self._pending = loop.call_later(self.limits.write_pending_s, self._check_pending)

    def on_sent(self) -> None:
        self.sent += 1
        self.writing_since, self.write_stuck = None, False
        self._update()

    def _check_pending(self) -> None:
        """The one timer of ``on_write``: re-armed for the write pending now, if any."""
        self._pending = None
        if self.writing_since is None:
            return
        loop = asyncio.get_running_loop()
        left = self.writing_since + self.limits.write_pending_s - loop.time()
        if left > 0:
            self._pending = loop.call_later(left, self._check_pending)
            return
        self.write_stuck = True
        self._update()

    def on_ack(self, read: int) -> None:
        """The client has read ``read`` messages (an ack never counts more than was written)."""
        self.acked = max(self.acked, min(read, self.sent))
        self._update()

    def client_closed(self) -> None:
        """The client half-closed: no more acks can come, so the transport measure takes over."""
        self.acks = False
        self._update()

    def _update(self) -> None:
        if not self.paused and (self.write_stuck or self.value >= self.limits.backlog_high):
            self._set(True)
        elif self.paused and not self.write_stuck and self.value <= self.limits.backlog_low:
            self._set(False)

    def _set(self, paused: bool) -> None:
        self.paused = paused
        log.debug(
            "Generate stream %s: produced %d, written %d, read %d (acks %s)%s",
            "paused" if paused else "resumed", self.produced, self.sent, self.acked, self.acks,
            f"; a write pending {self.limits.write_pending_s:g} s" if self.write_stuck else "",
        )
        self.on_pause(paused)
        if paused:
            self._stall = asyncio.get_running_loop().call_later(self.limits.stall_timeout_s, self.on_stall)
        else:
            self.cancel_stall()

    def cancel_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def close(self) -> None:
        """The stream ended: no timer of its may fire."""
        self.cancel_stall()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
