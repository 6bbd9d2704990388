"""The HTTP listener's connection cap: which connections hold a place, and which one gives it up.

A connection holds a place from ``connection_made`` until it is closed. Only a connection
*in a request* (its request head complete, its response not yet finished) holds it firmly;
one still waiting for a request head (just opened, sending its head slowly, or idle between
requests on keep-alive) can be reclaimed.

With ``max_connections`` open, a new connection takes the place of the connection that has been
waiting longest for its request head (closed at once); when every open connection is in a
request, the new one is answered 503 and closed without reading it.

NOTE: why reclaim rather than refuse: a slowloris flood opens connections that never finish
their head. Refusing past the cap would refuse the health probe and every honest client until
the header timeout freed the places, and the flood refills them faster. Reclaiming the oldest
waiting one keeps a honest client's connection for (cap / flood rate) seconds, far more than
the round trip its head needs, while requests already admitted are never touched. nginx does
the same with its idle and not-yet-read connections when it runs out of connections.
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
        self.waiting: OrderedDict[Reclaimable, None] = OrderedDict()  # oldest first
        self.refused = LogLimiter(log)  # ``total``: connections refused
        self.reclaimed = LogLimiter(log)  # ``total``: waiting connections closed to make room

    def admit(self, conn: Reclaimable) -> bool:
        """A new connection: True if it gets a place (waiting for its head), False if it is to be refused."""
        if len(self.open) >= self.max_connections:
            if not self.waiting:
                self.refused.note("HTTP connection cap (%d) reached with every connection in a request: "
                                  "new connections refused (503)", self.max_connections)
                return False
            victim, _ = self.waiting.popitem(last=False)
            self.open.discard(victim)
            self.reclaimed.note("HTTP connection cap (%d) reached: the connections waiting longest for a "
                                "request head closed to make room", self.max_connections)
            victim.reclaim()
        self.open.add(conn)
        self.waiting[conn] = None
        return True

    def in_request(self, conn: Reclaimable) -> None:
        """``conn``'s request head is complete: it holds its place until its response ends."""
        self.waiting.pop(conn, None)

    def awaiting_head(self, conn: Reclaimable) -> None:
        """``conn`` waits for its next request head (keep-alive): reclaimable again, as the newest."""
        if conn in self.open:
            self.waiting[conn] = None
            self.waiting.move_to_end(conn)

    def release(self, conn: Reclaimable) -> None:
        """``conn`` is closed (idempotent)."""
        self.open.discard(conn)
        self.waiting.pop(conn, None)
