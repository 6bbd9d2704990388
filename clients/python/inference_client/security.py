"""TLS credentials and bearer tokens for the clients (see docs/security.md).

``secure_credentials(ca, cert, key)`` builds channel credentials: ``ca`` is the
CA bundle that signed the server's certificate (None = the system roots),
``cert``/``key`` a client certificate for mTLS. ``token_metadata(token)`` is the
``authorization: Bearer <token>`` metadata entry, sent with every call; it works
over TLS and over plaintext (local testing), unlike gRPC call credentials,
which gRPC only sends over secure channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

TOKEN_ENV = "INFERENCE_TOKEN"
PemSource = str | Path | bytes | None


def _read(source: PemSource) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    return Path(source).read_bytes()


def secure_credentials(
    ca: PemSource = None, cert: PemSource = None, key: PemSource = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files (or bytes); ``cert`` and ``key`` go together."""
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs its key: give both cert and key, or neither")
    return grpc.ssl_channel_credentials(_read(ca), _read(key), _read(cert))


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The ``authorization`` metadata entry for ``token`` (empty without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def with_token(
    metadata: Sequence[tuple[str, str]] | None, token: str | None
) -> tuple[tuple[str, str], ...] | None:
    """``metadata`` plus the token's entry; None when both are empty (gRPC's "no metadata")."""
    out = tuple(metadata or ()) + token_metadata(token)
    return out or None


def make_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A sync channel: secure with ``credentials``, else plaintext."""
    if credentials is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, credentials, options=list(options))


def make_aio_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel: secure with ``credentials``, else plaintext."""
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(target, credentials, options=list(options))
