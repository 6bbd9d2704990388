"""How much a connection may hold for a client that does not read: a few KiB, not the kernel's megabytes.

A stream's backpressure (``service.api.stream_backlog``) counts the messages a
write has not handed over yet, so it only bites once writes block. Left to
itself the kernel lets them through long after the client stopped reading: a
socket's send buffer autotunes up to ``net.ipv4.tcp_wmem``'s maximum (4 MiB by
default; on loopback, whose segments are 64 KiB, a new connection starts near
that), so a client that reads nothing kept a request generating for minutes.

``TCP_NOTSENT_LOWAT`` caps the bytes the kernel holds *not yet sent* (beyond
what the client's TCP receive window accepts): past ``UNSENT_LOWAT`` the socket
stops taking writes, the writer blocks, and the backlog starts counting.
Measured on loopback, a socket whose peer (``SO_RCVBUF`` 4096) never read took
22.7 KB with it against 3.0 MB without. Sending is unchanged for a client that
reads: the limit is on what waits, not on what flows.

* ``limit_transport``: an HTTP connection (uvicorn calls ``connection_made``
  per accepted socket): the socket option, and the asyncio transport's own
  write buffer capped at ``TRANSPORT_HIGH`` (uvicorn's ``send`` waits while it
  is above).
* ``limit_listeners``: gRPC (grpc core owns its sockets and has no channel
  argument for this option): set on the listening socket of the port, which
  every accepted socket inherits. Found through ``/proc/self/fd`` (Linux);
  elsewhere nothing is set and the kernel's own buffers apply.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger("service.api")

UNSENT_LOWAT = 16 * 1024  # bytes a socket holds unsent before it stops taking writes
TRANSPORT_HIGH = 16 * 1024  # bytes an HTTP connection's asyncio transport buffers before ``send`` waits
# NOTE: Linux's value, absent from the socket module on some platforms
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)


def _set_lowat(sock: socket.socket) -> bool:
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, UNSENT_LOWAT)
    except OSError as exc:  # a platform without the option keeps the kernel's buffers
        log.debug("TCP_NOTSENT_LOWAT not set: %s", exc)
        return False
    return True


def limit_transport(transport: asyncio.BaseTransport) -> None:
    """Cap what an accepted HTTP connection holds for its client (see the module docstring)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        _set_lowat(sock)
    if isinstance(transport, asyncio.WriteTransport):
        transport.set_write_buffer_limits(high=TRANSPORT_HIGH)


def limit_listeners(port: int) -> int:
    """Set ``TCP_NOTSENT_LOWAT`` on this process's TCP listening sockets on ``port``; returns how many."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    done = 0
    for name in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            # NOTE: a duplicate of the descriptor: closing it leaves grpc core's own open
            with socket.socket(fileno=os.dup(int(name))) as sock:
                listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                if listening and sock.getsockname()[1] == port and _set_lowat(sock):
                    done += 1
        except (OSError, ValueError, IndexError, TypeError):  # closed meanwhile, or not an inet socket
            continue
    if not done:
        log.warning("no listening socket found on port %d: its connections keep the kernel's send buffers", port)
    return done
