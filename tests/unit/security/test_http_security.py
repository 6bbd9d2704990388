"""The HTTP front end's security without a model: tenants from bearer tokens, and TLS rotation for asyncio."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import ssl
from pathlib import Path

from service.security.auth import Credential
from service.security.tenancy import Tenancy
from service.security.tls import RotatingSSLContext
from tests.support.certs import CA


def tenancy(tmp_path: Path, doc: dict[str, object]) -> Tenancy:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(doc))
    return Tenancy.from_file(str(path))


def test_http_tenant_is_decided_like_a_grpc_call(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"tok-a").hexdigest()
    t = tenancy(tmp_path, {"tenants": {"a": {"token_sha256": [digest]}, "none": {"token_sha256": [
        hashlib.sha256(b"tok-n").hexdigest()], "roles": []}}})
    a = t.http_tenant("/v1/chat/completions", "tok-a", "user")
    assert isinstance(a, Credential) and a.tenant == "a" and a.digest == hashlib.sha256(b"tok-a").digest()
    assert t.http_tenant("/v1/chat/completions", None, "user")[0] == "UNAUTHENTICATED"  # type: ignore[index]
    assert t.http_tenant("/v1/chat/completions", "tok-x", "user") == ("UNAUTHENTICATED", "invalid bearer token")
    denied = t.http_tenant("/v1/completions", "tok-n", "user")
    assert isinstance(denied, tuple) and denied[0] == "PERMISSION_DENIED" and "needs role user" in denied[1]
    # open by default, as --prometheus-port; without a tenants file: anonymous, with nothing to re-check
    assert t.http_tenant("/metrics", None, "admin") == Credential("anonymous", "/metrics")
    assert Tenancy().http_tenant("/v1/completions", None, "user") == Credential("anonymous", "/v1/completions")


def test_an_http_credential_is_revoked_with_its_token(tmp_path: Path) -> None:
    """What a running HTTP request re-checks: its token's tenant in the file in force."""
    doc = {"tenants": {"a": {"token_sha256": [hashlib.sha256(b"tok-a").hexdigest()]},
                       "b": {"token_sha256": [hashlib.sha256(b"tok-b").hexdigest()]}}}
    t = tenancy(tmp_path, doc)
    a = t.http_tenant("/v1/completions", "tok-a", "user")
    assert isinstance(a, Credential) and t.recheck(a) is None
    del doc["tenants"]["a"]
    (tmp_path / "tenants.json").write_text(json.dumps(doc))
    t.reload()
    denial = t.recheck(a)
    assert denial is not None and denial[0].name == "UNAUTHENTICATED" and "no longer valid" in denial[1]
    assert t.http_tenant("/v1/completions", "tok-a", "user") == ("UNAUTHENTICATED", "invalid bearer token")


def test_open_http_paths_can_close_metrics(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"tok-a").hexdigest()
    t = tenancy(tmp_path, {"open_http_paths": [], "tenants": {"a": {"token_sha256": [digest]}}})
    assert t.http_tenant("/metrics", "tok-a", "admin")[0] == "PERMISSION_DENIED"
    assert t.http_tenant("/health", None, "user")[0] == "UNAUTHENTICATED"


async def _served_certificate(port: int, ca: CA) -> bytes:
    client = ssl.create_default_context(cadata=ca.pem.decode())
    _reader, writer = await asyncio.open_connection("localhost", port, ssl=client)
    cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return bytes(cert)


async def test_rotated_files_are_served_to_new_connections(tmp_path: Path) -> None:
    ca = CA()
    cert, key = ca.issue("localhost", server=True).write(tmp_path, "server")
    rotating = RotatingSSLContext(cert, key)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=rotating.context)
    port = server.sockets[0].getsockname()[1]
    try:
        first = await _served_certificate(port, ca)
        ca.issue("localhost", server=True).write(tmp_path, "server")
        stat = os.stat(cert)
        os.utime(cert, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        second = await _served_certificate(port, ca)
        assert second != first and rotating.rotations == 1
        (tmp_path / "server.key").write_text("half written")  # a broken pair keeps the current certificate
        os.utime(key, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
        assert await _served_certificate(port, ca) == second
    finally:
        server.close()
        await server.wait_closed()
