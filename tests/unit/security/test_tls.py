"""TLS without a model: handshake, and certificate rotation on disk without a restart (service.security.tls)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from service.security.tls import server_credentials
from tests.support.certs import CA


def changed(*paths: Path) -> None:
    """Move the files' mtimes a second on: a rewrite within the file system's mtime granularity would
    otherwise look unchanged (the watcher compares mtimes)."""
    for path in paths:
        ns = os.stat(path).st_mtime_ns + 1_000_000_000
        os.utime(path, ns=(ns, ns))


async def _check(port: int, ca: CA) -> int:
    creds = grpc.ssl_channel_credentials(ca.pem)
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(reply.status)


@pytest.fixture()
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, CA, Path]]:
    ca = CA()
    ca.issue("localhost", server=True).write(tmp_path, "server")
    creds, _files = server_credentials(tmp_path / "server.crt", tmp_path / "server.key")
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    yield port, ca, tmp_path
    await server.stop(0)


async def test_tls_handshake(tls_server: tuple[int, CA, Path]) -> None:
    port, ca, _ = tls_server
    assert await _check(port, ca) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.aio.AioRpcError) as info:  # a client that trusts another CA
        await _check(port, CA("Other CA"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_rotation_on_disk_reaches_new_connections(tls_server: tuple[int, CA, Path]) -> None:
    port, old_ca, folder = tls_server
    creds = grpc.ssl_channel_credentials(old_ca.pem)
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as kept:
        stub = health_pb2_grpc.HealthStub(kept)
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        new_ca = CA("Rotated CA")
        changed(*new_ca.issue("localhost", server=True).write(folder, "server"))  # rotation, no restart
        assert await _check(port, new_ca) == health_pb2.HealthCheckResponse.SERVING  # the next handshake
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _check(port, old_ca)  # new connections get the new certificate only
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)  # the open connection continues


def test_a_key_that_does_not_fit_is_refused_at_start_and_on_rotation(tmp_path: Path) -> None:
    ca = CA()
    good = ca.issue("localhost", server=True)
    other = ca.issue("localhost", server=True)
    cert, key = good.write(tmp_path, "server")
    key.write_bytes(other.key)  # a key from another pair
    with pytest.raises(OSError):
        server_credentials(cert, key)
    key.write_bytes(good.key)
    _creds, files = server_credentials(cert, key)
    cert.write_bytes(other.cert)  # half-way through a rotation: new cert, old key
    changed(cert)
    assert files.fetch() is None and files.rotations == 0  # keeps serving the old pair
    key.write_bytes(other.key)
    changed(key)
    assert files.fetch() is not None and files.rotations == 1
