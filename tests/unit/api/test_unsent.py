"""service.api.unsent on real loopback sockets: a peer that never reads takes KiB, not the kernel's MiB."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from service.api.unsent import (
    TCP_NOTSENT_LOWAT,
    TRANSPORT_HIGH,
    UNSENT_LOWAT,
    limit_listeners,
    limit_transport,
)

RCVBUF = 4096


@pytest.fixture()
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


def taken_by_a_peer_that_never_reads(listener: socket.socket) -> int:
    """Bytes a socket accepted from the listener takes, in writes of 1 KiB, before a write would block."""
    with socket.socket() as peer:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        peer.connect(listener.getsockname())
        accepted, _ = listener.accept()
        with accepted:
            accepted.setblocking(False)
            taken = 0
            try:
                while taken < 64 << 20:
                    taken += accepted.send(b"x" * 1024)
            except BlockingIOError:
                pass
            return taken


def test_the_listening_sockets_of_a_port_pass_the_limit_to_every_accepted_socket(listener: socket.socket) -> None:
    assert limit_listeners(listener.getsockname()[1]) == 1
    assert listener.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) == UNSENT_LOWAT
    taken = taken_by_a_peer_that_never_reads(listener)
    # the peer's receive buffer (the kernel doubles the 4096 asked for) and UNSENT_LOWAT, and a little more
    assert taken <= 2 * RCVBUF + UNSENT_LOWAT + 4096, taken


def test_without_the_limit_the_kernel_takes_far_more(listener: socket.socket) -> None:
    assert taken_by_a_peer_that_never_reads(listener) > 8 * (2 * RCVBUF + UNSENT_LOWAT)


def test_a_port_nobody_listens_on_is_left_alone(listener: socket.socket) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))  # bound, not listening
        assert limit_listeners(other.getsockname()[1]) == 0


async def test_an_http_connection_gets_the_socket_limit_and_a_small_write_buffer() -> None:
    made: asyncio.Future[asyncio.Transport] = asyncio.get_running_loop().create_future()

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            limit_transport(transport)
            assert isinstance(transport, asyncio.Transport)
            made.set_result(transport)

    loop = asyncio.get_running_loop()
    srv = await loop.create_server(Protocol, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    transport = await made
    sock = transport.get_extra_info("socket")
    assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) == UNSENT_LOWAT
    assert transport.get_write_buffer_limits()[1] == TRANSPORT_HIGH
    writer.close()
    transport.close()
    srv.close()
    await srv.wait_closed()
