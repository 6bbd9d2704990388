"""Clients and servers with TLS and bearer tokens (scenario H's cost of TLS and auth).

``tenants_file`` writes a tenants file for ``--auth-tokens``; ``Endpoint`` opens plaintext or TLS
channels that carry a token; ``TlsGrpcServer`` is a ``GrpcServer`` whose readiness check speaks TLS.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness.procs import GrpcServer


def tenants_file(folder: Path, tokens: dict[str, str]) -> Path:
    """``<folder>/tenants.json`` with one tenant per entry of ``tokens`` (name -> bearer token)."""
    doc = {
        "tenants": {n: {"token_sha256": [hashlib.sha256(t.encode()).hexdigest()]} for n, t in tokens.items()}
    }
    path = folder / "tenants.json"
    path.write_text(json.dumps(doc))
    return path


class _Token:
    """Adds ``authorization: Bearer <token>`` to every call (plaintext channels)."""

    def __init__(self, token: str) -> None:
        self.entry = ("authorization", f"Bearer {token}")

    def details(self, details: Any) -> Any:
        return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), self.entry))


class _UnaryToken(_Token, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self.details(details), request)


# NOTE: one class per call kind: grpc.aio files each interceptor under its first matching kind only.
class _StreamToken(_Token, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self.details(details), request_iterator)


class Endpoint:
    """How to reach one server: plaintext or TLS (trusting ``ca``), with or without a token."""

    def __init__(self, target: str, ca: bytes | None = None) -> None:
        self.target, self.ca = target, ca

    def channel(self, token: str | None = None) -> grpc.aio.Channel:
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        if self.ca is None:
            interceptors = [_UnaryToken(token), _StreamToken(token)] if token else None
            return grpc.aio.insecure_channel(self.target, options=opts, interceptors=interceptors)
        creds = grpc.ssl_channel_credentials(self.ca)
        if token:  # what a real client does: call credentials on a TLS channel
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        return grpc.aio.secure_channel(self.target.replace("127.0.0.1", "localhost"), creds, options=opts)


class TlsGrpcServer(GrpcServer):
    """``GrpcServer`` whose readiness check speaks TLS."""

    def __init__(
        self, label: str, model: str | Path, ca: bytes, *flags: str, threads: int | None = None
    ) -> None:
        super().__init__(label, model, *flags, threads=threads)
        self.ca = ca

    def ready(self) -> bool:
        creds = grpc.ssl_channel_credentials(self.ca)
        with grpc.secure_channel(f"localhost:{self.port}", creds) as ch:
            try:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            except grpc.RpcError:
                return False
            return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
