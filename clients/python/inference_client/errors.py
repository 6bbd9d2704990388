"""The one exception type of the client: a gRPC status code and its message.

Every failure the client surfaces — a failed RPC, a per-request ``error`` event
on the Generate stream, a deadline — is an :class:`InferenceError`, so callers
catch one type and branch on :attr:`InferenceError.code`.
"""

from __future__ import annotations

import re
from typing import Any

import grpc

_CODES_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}
_HINT_IN_MESSAGE = re.compile(r"retry after (\d+)\s*ms", re.IGNORECASE)
RETRY_AFTER_KEY = "retry-after-ms"
REASON_KEY = "inference-unavailable-reason"
STATUS_DETAILS_KEY = "grpc-status-details-bin"
# Reasons of an UNAVAILABLE that mean "this replica is going away": safe to send the request to
# another one when none of its tokens were received.
ELSEWHERE_REASONS = frozenset({"draining", "engine_failed"})


def status_code(number: int) -> grpc.StatusCode:
    """Map a google.rpc.Code number to ``grpc.StatusCode`` (UNKNOWN if unmapped)."""
    return _CODES_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


def hint_from_message(message: str) -> float | None:
    """Seconds of a "retry after N ms" phrase in ``message``, or None."""
    match = _HINT_IN_MESSAGE.search(message)
    return int(match.group(1)) / 1000.0 if match else None


def hint_from_metadata(metadata: Any) -> float | None:
    """Seconds of the ``retry-after-ms`` trailing-metadata entry, or None.

    Accepts the sync (tuple of pairs) and the asyncio (``grpc.aio.Metadata``)
    metadata shapes; a malformed value is ignored.
    """
    for key, value in metadata or ():
        if key == RETRY_AFTER_KEY:
            try:
                return max(0.0, int(value) / 1000.0)
            except (TypeError, ValueError):
                return None
    return None


def reason_from_metadata(metadata: Any) -> str:
    """The server's reason for a failed RPC ("" when absent): the ``inference-unavailable-reason``
    trailing-metadata value, else the ``reason`` of a ``google.rpc.ErrorInfo`` status detail
    (``grpc-status-details-bin``; e.g. GenerateJSON's "schema_not_enforced")."""
    for key, value in metadata or ():
        if key == REASON_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    for key, value in metadata or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            return _error_info_reason(value)
    return ""


def _error_info_reason(raw: bytes) -> str:
    """The first ``google.rpc.ErrorInfo`` reason of a serialized ``google.rpc.Status`` ("" if none)."""
    from google.protobuf.message import DecodeError
    from google.rpc import error_details_pb2, status_pb2

    try:
        status = status_pb2.Status.FromString(raw)
    except DecodeError:
        return ""
    info = error_details_pb2.ErrorInfo()
    return next((info.reason for d in status.details if d.Unpack(info)), "")


class InferenceError(Exception):
    """A gRPC status other than OK, from an RPC or from a per-request error event.

    Attributes:
        code: the status code, e.g. ``grpc.StatusCode.INVALID_ARGUMENT``.
        message: the server's (or client's) description.
        retry_after: the server's retry hint in seconds, if it sent one.
        attempts: how many attempts were made before giving up (1 = no retry).
        request_id: the Generate request the error belongs to, if any.
        reason: the server's machine-readable cause ("" if none): for UNAVAILABLE "draining",
            "engine_failed" (both mean "retry on another replica") or "loading"; for INVALID_ARGUMENT
            "schema_not_enforced" (a JSON document broke a schema keyword the grammar could not enforce).
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        retry_after: float | None = None,
        attempts: int = 1,
        request_id: str | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.attempts = attempts
        self.request_id = request_id
        self.reason = reason

    @property
    def elsewhere(self) -> bool:
        """True when the replica that answered is going away (draining, failed engine)."""
        return self.reason in ELSEWHERE_REASONS

    @property
    def status(self) -> str:
        """The status code name, e.g. ``"INVALID_ARGUMENT"``."""
        return self.code.name

    @classmethod
    def from_rpc_error(cls, exc: grpc.RpcError, *, attempts: int = 1) -> InferenceError:
        """Wrap a failed RPC (sync ``grpc.RpcError`` or ``grpc.aio.AioRpcError``)."""
        code, message, metadata = rpc_error_parts(exc)
        hint = hint_from_metadata(metadata)
        if hint is None:
            hint = hint_from_message(message)
        return cls(code, message, retry_after=hint, attempts=attempts, reason=reason_from_metadata(metadata))


def rpc_error_parts(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str, Any]:
    """(code, details, trailing metadata) of a failed RPC, tolerating bare RpcErrors."""
    code_fn = getattr(exc, "code", None)
    details_fn = getattr(exc, "details", None)
    trailers_fn = getattr(exc, "trailing_metadata", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    trailers = trailers_fn() if callable(trailers_fn) else None
    return (code or grpc.StatusCode.UNKNOWN, details or str(exc), trailers)
