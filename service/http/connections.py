"""The HTTP listener's connection cap: which connections hold a place, and which one gives it up.

A connection holds a place from ``connection_made`` until it is closed. Only a connection
*in a request* (its request head complete, its response not yet finished) holds it firmly;
one still waiting for a request head (just opened, sending its head slowly, or idle between
requests on keep-alive) can be reclaimed.

With ``max_connections`` open, a new connection takes the place of a waiting one (closed at
once): the one waiting longest among those that have **never completed a request** (just opened,
half-sent, slow), and only when there is none the one idle longest among kept-alive connections
that have served requests. When every open connection is in a request, the new one is answered
503 and closed without reading it.

NOTE: why reclaim rather than refuse: a slowloris flood opens connections that never finish
their head. Refusing past the cap would refuse the health probe and every honest client until
the header timeout freed the places, and the flood refills them faster. Reclaiming the oldest
waiting one keeps a honest client's connection for (cap / flood rate) seconds, far more than
the round trip its head needs, while requests already admitted are never touched. nginx does
the same with its idle and not-yet-read connections when it runs out of connections.

NOTE: why a connection that has served a request goes last: a flood of half-sent heads arrives
in bursts (asyncio accepts up to the listen backlog, 2,048, per wake-up), each new connection
reclaiming one place, so with one queue a burst of ``max_connections`` cycled through every
waiting connection, a health probe's idle keep-alive connection among them (issue #35's
benchmark: 2,002 reclaimed in a 3,000-socket flood, the probe's reconnect 445 ms). A kept-alive
connection has shown it sends whole requests; the flood's have not. An attacker who completes a
request per connection to be treated so pays a request each and is bounded by the keep-alive
timeout.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Protocol

from service.http.log_limits import LogLimiter

log = logging.getLogger("service.http")


class Reclaimable(Protocol):
    def reclaim(self) -> None:
        """Close the connection now (it was waiting for a request head)."""


class ConnectionGuard:
    """The places of one HTTP listener (see the module docstring); event loop only."""

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self.open: set[Reclaimable] = set()
        self.fresh: OrderedDict[Reclaimable, None] = OrderedDict()  # waiting, no request completed; oldest first
        self.idle: OrderedDict[Reclaimable, None] = OrderedDict()  # waiting, served a request; idle longest first
        self.refused = LogLimiter(log)  # ``total``: connections refused
        self.reclaimed = LogLimiter(log)  # ``total``: waiting connections closed to make room

    def admit(self, conn: Reclaimable) -> bool:
        """A new connection: True if it gets a place (waiting for its head), False if it is to be refused."""
        if len(self.open) >= self.max_connections:
            queue = self.fresh or self.idle
            if not queue:
                self.refused.note("HTTP connection cap (%d) reached with every connection in a request: "
                                  "new connections refused (503)", self.max_connections)
                return False
            victim, _ = queue.popitem(last=False)
            self.open.discard(victim)
            self.reclaimed.note("HTTP connection cap (%d) reached: the connections waiting longest for a "
                                "request head closed to make room", self.max_connections)
            victim.reclaim()
        self.open.add(conn)
        self.fresh[conn] = None
        return True

    def in_request(self, conn: Reclaimable) -> None:
        """``conn``'s request head is complete: it holds its place until its response ends."""
        self.fresh.pop(conn, None)
        self.idle.pop(conn, None)

    def awaiting_head(self, conn: Reclaimable) -> None:
        """``conn`` served a request and waits for its next head (keep-alive): reclaimable again, after
        every connection that never completed one, as the newest idle one."""
        if conn in self.open:
            self.fresh.pop(conn, None)
            self.idle[conn] = None
            self.idle.move_to_end(conn)

    @property
    def waiting(self) -> int:
        """Connections that may be reclaimed (waiting for a request head)."""
        return len(self.fresh) + len(self.idle)

    def release(self, conn: Reclaimable) -> None:
        """``conn`` is closed (idempotent)."""
        self.open.discard(conn)
        self.fresh.pop(conn, None)
        self.idle.pop(conn, None)
