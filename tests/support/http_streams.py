"""Shared steps of the HTTP dialect tests: a client that leaves mid-stream, a tenants file."""

from __future__ import annotations

import hashlib
import json
import socket
from typing import Any

from tests.support.helpers import wait_for
from tests.support.server import RunningServer, assert_kv_clean


def tenants_json(*tokens: str, tenant: str = "t") -> str:
    """A tenants file (``--auth-tokens``) giving ``tokens`` to one tenant."""
    return json.dumps({"tenants": {tenant: {"token_sha256": [hashlib.sha256(t.encode()).hexdigest() for t in tokens]}}})


def cancelled_so_far(srv: RunningServer) -> int:
    return sum(t.cancelled for t in srv.engine.metrics.tiers.values())


def leave_mid_stream_and_see_it_cancelled(srv: RunningServer, path: str, body: dict[str, Any], marker: bytes) -> None:
    """POST ``body`` to ``path`` on a raw socket, read until ``marker`` (a first token was sent), close the
    socket: the engine counts one more cancelled request and the KV pool ends clean."""
    before = cancelled_so_far(srv)
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", srv.server.http_port), timeout=600) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (path.encode(), len(payload), payload))
        seen = b""
        while marker not in seen:
            chunk = sock.recv(65536)
            assert chunk, f"the stream ended before {marker!r}: {seen[-300:]!r}"
            seen += chunk
    assert wait_for(lambda: cancelled_so_far(srv) > before, timeout=600), "the request was not cancelled"
    assert_kv_clean(srv)
