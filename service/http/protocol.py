"""uvicorn's h11 protocol with the HTTP listener's limits (``ConnectionLimits``, docs/security.md).

uvicorn has a keep-alive timeout and h11 a bound on an incomplete request head, but nothing
bounds how long a client may take to send its head or its body, nor how many connections are
open. ``GuardedH11Protocol`` adds, per connection:

* a place under the connection cap (``service.http.connections``): taken in ``connection_made``
  (past the cap with nothing to reclaim: a canned 503 and close, nothing read);
* a request-head deadline: ``header_timeout_s`` from the connection (on a kept-alive connection,
  from the first byte of the next request; before it uvicorn's keep-alive timeout runs) to a
  complete head, else 408 and close (closed silently when nothing at all came);
* a request-body deadline: ``body_timeout_s`` plus a second per ``body_min_rate`` bytes received
  (a trickle gains nothing), else 408 and close; the route reading the body then sees the client
  gone (Starlette's ``ClientDisconnect``);
* a request head larger than ``max_header_bytes`` (h11's incomplete-event bound, and the same
  bound on a head that arrived whole) is answered 431;
* ``TCP_NODELAY`` (NOTE: accepted sockets came without it, so Nagle held each stream's first event
  until the client's delayed ACK of the status line, 40 ms later).

NOTE: an error response to a client still sending (a 200 KB head) is followed by a lingering
close: the write side is shut, and what the client still sends is read and dropped for up to
``LINGER_S``; closing at once reset the connection, and a reset discards the response before
the client reads it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from http import HTTPStatus
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.api.unsent import limit_transport
from service.http.config import ConnectionLimits
from service.http.connections import ConnectionGuard
from service.http.errors import ApiError

LINGER_S = 2.0
LINGER_BYTES = 1 << 20  # dropped at most while lingering, then closed


def error_body(status: int, message: str, code: str) -> bytes:
    return json.dumps(ApiError(status, message, code=code).body()).encode()


def error_headers(body: bytes, retry_after: bool = False) -> list[tuple[bytes, bytes]]:
    retry = [(b"retry-after", b"1")] if retry_after else []
    return [(b"content-type", b"application/json"), (b"connection", b"close"), *retry,
            (b"content-length", str(len(body)).encode())]


def error_bytes(status: int, message: str, code: str, *, retry_after: bool = False) -> bytes:
    """A whole HTTP/1.1 response carrying OpenAI's error object, for when h11 cannot send one
    (no request was read)."""
    body = error_body(status, message, code)
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    head += [name + b": " + value for name, value in error_headers(body, retry_after)]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


REFUSED = error_bytes(503, "too many open connections; retry shortly", "too_many_connections", retry_after=True)


class _WatchedConnection(h11.Connection):
    """h11's server connection, showing its protocol each event it yields and the error it raised."""

    def __init__(self, owner: GuardedH11Protocol, max_head: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head)
        self.owner = owner
        self.error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
            self.owner.on_event(event)
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise
        return event


class GuardedH11Protocol(H11Protocol):
    """See the module docstring; ``bind`` makes the class of one listener."""

    guard: ClassVar[ConnectionGuard]
    limits: ClassVar[ConnectionLimits]

    @classmethod
    def bind(cls, guard: ConnectionGuard, limits: ConnectionLimits) -> type[GuardedH11Protocol]:
        return type("ListenerH11Protocol", (cls,), {"guard": guard, "limits": limits})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watched = _WatchedConnection(self, self.limits.max_header_bytes)
        self.conn = self.watched
        self.timer: asyncio.TimerHandle | None = None
        self.refused = False
        self.lingering: int | None = None  # bytes dropped while lingering
        self.body_start, self.body_bytes = 0.0, 0

    # -- the connection's place -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if not self.guard.admit(self):
            self.refused = True
            transport.write(REFUSED)
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        limit_transport(transport)  # a client that does not read: its connection holds KiB, not MiB
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self.guard.release(self)
        self._disarm()
        super().connection_lost(exc)

    def reclaim(self) -> None:
        self.transport.close()

    # -- request heads and bodies ---------------------------------------------------------------
    def on_event(self, event: Any) -> None:
        """Every event h11 yields (``_WatchedConnection``); raises RemoteProtocolError(431) for a large head."""
        if isinstance(event, h11.Request):
            self._disarm()
            self.guard.in_request(self)
            size = len(event.method) + len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
            if size > self.limits.max_header_bytes:
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
            if self.conn.their_state is h11.SEND_BODY:
                self.body_start, self.body_bytes = self.loop.time(), 0
                self._arm(self.limits.body_timeout_s, self._body_check)
        elif isinstance(event, h11.Data):
            self.body_bytes += len(event.data)
        elif isinstance(event, h11.EndOfMessage):
            self._disarm()
            if self.conn.our_state is h11.DONE:  # answered before its body was in (a 401, a 413): idle now
                self._unset_keepalive_if_required()  # NOTE: uvicorn arms no keep-alive timer on this path
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():  # NOTE: before uvicorn's, which may start a pipelined request
            self.guard.awaiting_head(self)  # idle: uvicorn's keep-alive timer runs until the next byte
        super().on_response_complete()

    def _head_late(self) -> None:
        self.timer = None
        if self.transport.is_closing():
            return
        partial, _ = self.conn.trailing_data
        if partial and self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            message = f"request head not received within {self.limits.header_timeout_s:g} s"
            self.transport.write(error_bytes(408, message, "request_timeout"))
        self.transport.close()  # NOTE: silently when nothing came: a client may be sending right now

    def _body_check(self) -> None:
        """The body deadline: moved on by the bytes received; restarted while uvicorn itself stops reading."""
        self.timer = None
        now, limits = self.loop.time(), self.limits
        if self.flow.read_paused:  # the route has not taken what came: not the client's delay
            self.body_start, self.body_bytes = now, 0
        deadline = self.body_start + limits.body_timeout_s + self.body_bytes / limits.body_min_rate
        if now < deadline:
            self._arm(deadline - now, self._body_check)
            return
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            return  # a route answering without the rest of the body: its response is left alone
        if cycle is not None and not cycle.response_started and not self.transport.is_closing():
            message = (f"request body not received in time ({limits.body_timeout_s:g} s plus 1 s per "
                       f"{limits.body_min_rate} bytes)")
            self._send_error(408, message, "request_timeout")
            cycle.disconnected = True  # the route's receive() says the client is gone; its sends are dropped
            cycle.message_event.set()
        self.transport.close()  # NOTE: also after an early answer (a 401 to a body trickled on and on)

    # -- malformed requests -------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a RemoteProtocolError: OpenAI's error object, h11's status hint (431 for a
        large head), then a lingering close. While a route answers the request, the connection just ends."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            self.transport.close()
            return
        error = self.watched.error
        status = error.error_status_hint if error is not None else 400
        if status == 431:
            message = f"request head (request line and headers) exceeds {self.limits.max_header_bytes} bytes"
        else:
            message = f"invalid HTTP request: {error or msg}"
        try:
            self._send_error(status, message, "request_header_fields_too_large" if status == 431 else "bad_request")
        except h11.LocalProtocolError:
            self.transport.close()
            return
        self._linger()

    def _send_error(self, status: int, message: str, code: str) -> None:
        """OpenAI's error object through h11 (a request head was read, or failed to parse)."""
        body = error_body(status, message, code)
        response = h11.Response(status_code=status, headers=error_headers(body), reason=HTTPStatus(status).phrase)
        for event in (response, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")

    def _linger(self) -> None:
        self.guard.in_request(self)  # never reclaimed (it is closing anyway)
        if not self.transport.can_write_eof():  # TLS: no half-close
            self.transport.close()
            return
        self.lingering = 0
        self.transport.write_eof()
        self._arm(LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self.lingering is None:
            if self.timer is None and self.conn.their_state is h11.IDLE:  # the first byte of a kept-alive request
                self._arm(self.limits.header_timeout_s, self._head_late)
            super().data_received(data)
            return
        self.lingering += len(data)
        if self.lingering > LINGER_BYTES:
            self.transport.close()

    # -- the one timer -----------------------------------------------------------------------------
    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self.timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
