"""OpenAI's error object, and the one mapping from the service's gRPC status names to HTTP.

Every failure of the HTTP API is answered as OpenAI answers it::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

with the matching HTTP status; 429 and 503 carry ``Retry-After`` (seconds).
A refusal by a tenant quota has ``code`` set to the quota's name
(``max_concurrent``, ``max_queued``, ``tokens_per_minute``) so a caller can
tell it from server overload (``server_is_overloaded``). A 503 of the drain
rule (``service.api.intake``) has ``code`` set to its reason (``loading``,
``draining``, ``engine_failed``) and carries it in the
``inference-unavailable-reason`` header, as gRPC carries it in the trailing
metadata: ``draining`` and ``engine_failed`` mean "retry on another replica".
"""

from __future__ import annotations

import json
import math

from starlette.responses import Response

from service.api.readiness import REASON_METADATA_KEY

# gRPC status name -> (HTTP status, OpenAI error type)
STATUS = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "OUT_OF_RANGE": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "ALREADY_EXISTS": (409, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "invalid_request_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable_error"),
    "DEADLINE_EXCEEDED": (504, "timeout_error"),
    "CANCELLED": (503, "service_unavailable_error"),
    "INTERNAL": (500, "server_error"),
    "UNIMPLEMENTED": (501, "server_error"),
}
# Request fields the intake's validation names first in its message, under the HTTP API's own names:
# such a 400 names its parameter (e.g. a logit_bias token id outside the vocabulary).
NAMED_PARAMS = frozenset({"logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty", "max_tokens",
                          "temperature", "top_p", "top_k", "min_p", "n", "stop", "top_logprobs", "messages"})
TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
         413: "invalid_request_error", 415: "invalid_request_error"}


class ApiError(Exception):
    """An HTTP API failure; ``response()`` is its OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        retry_after_ms: int = 0,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type or TYPES.get(status, "invalid_request_error")
        self.param = param
        self.code = code
        self.retry_after_ms = retry_after_ms
        self.reason = reason  # UNAVAILABLE: loading, draining or engine_failed

    def body(self) -> dict[str, object]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        out = {REASON_METADATA_KEY: self.reason} if self.reason else {}
        if self.retry_after_ms > 0:
            out["retry-after"] = str(max(1, math.ceil(self.retry_after_ms / 1000)))
        return out

    def response(self) -> Response:
        return Response(
            json.dumps(self.body()), self.status, headers=self.headers(), media_type="application/json"
        )


def bad_param(param: str, message: str) -> ApiError:
    """A 400 naming ``param`` (OpenAI's shape for a bad or unsupported argument)."""
    return ApiError(400, message, param=param)


def from_status(status: str, message: str, retry_after_ms: int = 0, quota: str = "", reason: str = "") -> ApiError:
    """The HTTP error of a gRPC status name as the intake or engine report it (``reason``: UNAVAILABLE's why)."""
    http, kind = STATUS.get(status, (500, "server_error"))
    code = quota or reason or ("server_is_overloaded" if status == "RESOURCE_EXHAUSTED" else None)
    if status == "UNAVAILABLE" and not retry_after_ms:
        retry_after_ms = 1000
    first = message.split(" ", 1)[0]
    param = first if http == 400 and first in NAMED_PARAMS else None
    return ApiError(http, message, type=kind, param=param, code=code, retry_after_ms=retry_after_ms, reason=reason)
