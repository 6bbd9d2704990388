"""Token (and mTLS identity) authentication: a grpc.aio server interceptor.

Every call to a service that is not open (health and reflection are open by
default, see ``open_services`` in the tenants file) needs a tenant:

* ``authorization: Bearer <token>`` metadata whose SHA-256 is in the tenants
  file (compared in constant time; two ``authorization`` entries: UNAUTHENTICATED), or else
* with mTLS on, a client certificate whose SAN URI or subject CN is one of a
  tenant's ``identities``.

No tenant: UNAUTHENTICATED. A tenant without the method's role (GetMetrics
needs ``admin``, the rest ``user``; ``admin`` includes ``user``):
PERMISSION_DENIED. Token rejections are decided from the metadata alone, before
the request message is even deserialized, so nothing reaches the servicer or
the engine. The authenticated tenant's name is put in ``CURRENT_TENANT`` (a
contextvar) for the servicer to stamp on the request, and what authenticated the
call in ``CURRENT_CREDENTIAL``, so a long-lived stream can check it again after
the tenants file changed (``Credential.recheck``). Tokens are never logged nor
kept: a credential holds the token's SHA-256.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc

from service.security.tenants import ANONYMOUS, Tenant, TenantFile, TenantTable, token_digest

log = logging.getLogger("service.auth")

ADMIN_METHODS = frozenset({"GetMetrics"})
Denial = tuple[grpc.StatusCode, str]
REVOKED = "the credentials of this stream are no longer valid (tenants file changed); open a new stream"


@dataclass(frozen=True)
class Credential:
    """What authenticated a call: the token's SHA-256 (never the token) or the client certificate's identities."""

    tenant: str
    method: str
    digest: bytes | None = None
    identities: tuple[str, ...] = ()

    def recheck(self, table: TenantTable) -> Denial | None:
        """None while ``table`` still gives this credential to the same tenant, with the method's role.

        NOTE: a digest lookup (constant-time compares), cheap enough to run per request; a token
        moved to another tenant counts as revoked for the stream (its requests carry the old tenant).
        """
        if self.digest is not None:
            tenant = table.by_digest(self.digest)
        else:
            tenant = table.by_identity(list(self.identities))
        if tenant is None or tenant.name != self.tenant:
            return grpc.StatusCode.UNAUTHENTICATED, REVOKED
        return _role_check(tenant, self.method)


CURRENT_TENANT: ContextVar[str] = ContextVar("inference_tenant", default=ANONYMOUS)
CURRENT_CREDENTIAL: ContextVar[Credential | None] = ContextVar("inference_credential", default=None)


def current_tenant() -> str:
    """The tenant of the RPC being handled (``anonymous`` without authentication)."""
    return CURRENT_TENANT.get()


def current_credential() -> Credential | None:
    """What authenticated the RPC being handled (None without authentication)."""
    return CURRENT_CREDENTIAL.get()


class AmbiguousCredentials(ValueError):
    """More than one ``authorization`` entry: which one counts is not for the server to guess."""


def bearer_token(metadata: Any) -> str | None:
    """The token of the ``authorization: Bearer <token>`` entry, or None; AmbiguousCredentials for two
    entries or more.

    NOTE: the scheme is case-insensitive and spaces around the token are dropped (RFC 6750 and
    RFC 9110: ``Bearer`` 1*SP token, the scheme case-insensitive), so ``bearer  tok`` is ``tok``.
    """
    values = [value for key, value in metadata or () if key == "authorization"]
    if len(values) > 1:
        raise AmbiguousCredentials(f"{len(values)} authorization headers (or metadata entries): send exactly one")
    if not values:
        return None
    text = values[0].decode() if isinstance(values[0], bytes) else values[0]
    scheme, _, token = text.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def peer_identities(context: Any) -> list[str]:
    """A verified client certificate's SAN URIs and subject CN (empty without mTLS)."""
    auth = context.auth_context() or {}
    out: list[str] = []
    for key in ("peer_spiffe_id", "peer_uri", "x509_common_name"):
        out.extend(v.decode() for v in auth.get(key, ()))
    return out


def has_role(tenant: Tenant, role: str) -> bool:
    """``admin`` includes ``user``."""
    return role in tenant.roles or "admin" in tenant.roles


def _role_check(tenant: Tenant, method: str) -> Denial | None:
    needed = "admin" if method in ADMIN_METHODS else "user"
    if has_role(tenant, needed):
        return None
    return (
        grpc.StatusCode.PERMISSION_DENIED,
        f"tenant {tenant.name!r} may not call {method} (needs role {needed})",
    )


def authenticate(table: TenantTable, token: str | None, role: str, what: str) -> Credential | tuple[str, str]:
    """The credential of ``token`` (constant-time lookup) if its tenant has ``role``, else (gRPC status name, why).

    For front ends without a gRPC context (the HTTP API): the same rules as the
    interceptor, ``what`` names the call in the PERMISSION_DENIED message and is
    the credential's method (a running request re-checks it with ``recheck``).
    """
    if token is None:
        return "UNAUTHENTICATED", "missing 'Authorization: Bearer <token>' header"
    digest = token_digest(token)
    tenant = table.by_digest(digest)
    if tenant is None:
        return "UNAUTHENTICATED", "invalid bearer token"
    if not has_role(tenant, role):
        return "PERMISSION_DENIED", f"tenant {tenant.name!r} may not call {what} (needs role {role})"
    return Credential(tenant.name, what, digest=digest)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call against the tenants file; see the module docstring."""

    def __init__(self, tenants: TenantFile, mtls: bool = False) -> None:
        self.tenants = tenants
        self.mtls = mtls
        self.denied = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        service, _, method = details.method.lstrip("/").partition("/")
        table = self.tenants.table
        if service in table.open_services:
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:
            return handler  # unknown method: UNIMPLEMENTED as usual
        try:
            token = bearer_token(details.invocation_metadata)
        except AmbiguousCredentials as exc:
            return self._deny(handler, (grpc.StatusCode.UNAUTHENTICATED, str(exc)))
        if token is None and self.mtls:
            return _wrap(handler, lambda ctx: self._by_identity(table, ctx, method))
        digest = token_digest(token) if token is not None else None
        tenant = table.by_digest(digest) if digest is not None else None
        if tenant is None:
            why = "invalid bearer token" if token else "missing 'authorization: Bearer <token>' metadata"
            return self._deny(handler, (grpc.StatusCode.UNAUTHENTICATED, why))
        denial = _role_check(tenant, method)
        if denial is not None:
            return self._deny(handler, denial)
        credential = Credential(tenant.name, method, digest=digest)
        return _wrap(handler, lambda _ctx: credential)

    def _by_identity(self, table: TenantTable, context: Any, method: str) -> Credential | Denial:
        identities = peer_identities(context)
        tenant = table.by_identity(identities) if identities else None
        if tenant is None:
            self.denied += 1
            why = "client certificate names no tenant" if identities else "missing bearer token"
            return grpc.StatusCode.UNAUTHENTICATED, why
        denial = _role_check(tenant, method)
        if denial is not None:
            self.denied += 1
            return denial
        return Credential(tenant.name, method, identities=tuple(identities))

    def _deny(self, handler: grpc.RpcMethodHandler, denial: Denial) -> grpc.RpcMethodHandler:
        self.denied += 1
        log.debug("call refused: %s: %s", denial[0].name, denial[1])
        return _refusal(handler, denial)


def _refusal(handler: Any, denial: Denial) -> grpc.RpcMethodHandler:
    """A handler of the same shape that aborts at once; it never deserializes the request."""
    code, message = denial

    async def unary(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def streaming(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - never reached; makes this an async generator

    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, None, serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, None, serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, None, serializer)
    return grpc.unary_unary_rpc_method_handler(unary, None, serializer)


def _wrap(handler: Any, authorize: Callable[[Any], Credential | Denial]) -> grpc.RpcMethodHandler:
    """The same handler, run with ``CURRENT_TENANT``/``CURRENT_CREDENTIAL`` set from ``authorize(context)``
    (or refused with its denial)."""

    async def admit(context: Any) -> None:
        verdict = authorize(context)
        if isinstance(verdict, tuple):
            await context.abort(*verdict)
            return
        CURRENT_TENANT.set(verdict.tenant)
        CURRENT_CREDENTIAL.set(verdict)

    if handler.response_streaming:
        kind = "stream_stream" if handler.request_streaming else "unary_stream"
        behavior = getattr(handler, kind)

        async def streaming(request: Any, context: Any) -> Any:
            await admit(context)
            result = behavior(request, context)
            if hasattr(result, "__aiter__"):
                async for item in result:
                    yield item
            else:
                for item in result:
                    yield item

        return handler._replace(**{kind: streaming})
    kind = "stream_unary" if handler.request_streaming else "unary_unary"
    behavior = getattr(handler, kind)

    async def unary(request: Any, context: Any) -> Any:
        await admit(context)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return handler._replace(**{kind: unary})
